"""The prompt cache, admission and observability through the app:
multi-turn reuse over the openai SDK, session affinity, the admin routes,
/stats and /metrics, 429 and context_over_budget shapes; and, on real
servers, an SSD-cached prefix found again after a restart."""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from inference.engine.admission import MAX_QUEUED
from tests.helpers import ServerProcess, server_env

LONG_TEXT = " ".join(f"fact {i}: the fox jumps over the lazy dog." for i in range(30))


def _stats(http) -> dict:
    """/stats, through anything with httpx's `get` (the app in this process, a client of a server)."""
    return http.get("/stats").json()


@pytest.fixture
def app(served):
    """The serving stack in this process, with `hearth serve`'s defaults."""
    return served()


def test_multi_turn_chat_reuses_the_shared_prefix(app, tiny_model):
    client = app.openai()
    before = _stats(app)["prompt_cache"]
    history = [{"role": "system", "content": "You answer briefly. " + LONG_TEXT},
               {"role": "user", "content": "Hello there!"}]
    first = client.chat.completions.create(model=tiny_model, messages=history, max_tokens=8)
    # Other tests share at most the template's opening tokens with this system prompt.
    assert first.usage.prompt_tokens_details.cached_tokens < 16
    assert first.usage.model_extra["lane"] == "serial"  # alone from start to end: the single-row path
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And the fox?"}]
    second = client.chat.completions.create(model=tiny_model, messages=history, max_tokens=8)
    cached = second.usage.prompt_tokens_details.cached_tokens
    # Everything up to the first turn's generation prompt comes from the cache (the
    # template renders that prompt's tail differently once the turn is history).
    assert first.usage.prompt_tokens - 32 <= cached < second.usage.prompt_tokens
    after = _stats(app)["prompt_cache"]
    assert after["hits"] >= before["hits"] + 1
    assert after["entries"] >= 1 and 0 < after["bytes"] <= after["max_bytes"]


def test_streaming_usage_reports_cached_tokens_and_lane(app, tiny_model):
    client = app.openai()
    messages = [{"role": "user", "content": "Stream this please. " + LONG_TEXT}]
    for _ in range(2):
        stream = client.chat.completions.create(model=tiny_model, messages=messages, max_tokens=6, stream=True,
                                                stream_options={"include_usage": True})
        usage = [c.usage for c in stream if c.usage is not None][-1]
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1
    assert usage.model_extra["lane"] == "serial"


def test_session_affinity_in_body_and_headers(app, tiny_model):
    client = app.openai()
    messages = [{"role": "user", "content": "Session probe. " + LONG_TEXT}]
    before = _stats(app)["prompt_cache"]
    client.chat.completions.create(model=tiny_model, messages=messages, max_tokens=4,
                                   extra_body={"session_id": "agent-42"})
    client.chat.completions.create(model=tiny_model, messages=messages, max_tokens=4,
                                   extra_body={"session_id": "agent-42"})
    mid = _stats(app)["prompt_cache"]
    assert mid["session_hits"] == before["session_hits"] + 1  # the second call found its session's entry
    assert mid["session_misses"] == before["session_misses"] + 1  # the first had none yet
    client.chat.completions.create(model=tiny_model, messages=messages, max_tokens=4,
                                   extra_headers={"x-session-affinity": "agent-42"})
    assert _stats(app)["prompt_cache"]["session_hits"] == mid["session_hits"] + 1

    closed = app.post("/admin/cache/session/close", json={"session_id": "agent-42"})
    assert closed.status_code == 200 and closed.json() == {"closed": True}
    assert app.post("/admin/cache/session/close", json={}).json() == {"closed": False}
    bad = app.post("/admin/cache/session/close", content=b"[1")
    assert bad.status_code == 400 and "invalid JSON" in bad.json()["error"]["message"]
    client.chat.completions.create(model=tiny_model, messages=messages, max_tokens=4,
                                   extra_body={"session_id": "agent-42"})
    after = _stats(app)["prompt_cache"]
    assert after["session_misses"] == mid["session_misses"] + 1  # closed: a fresh association
    with pytest.raises(openai.BadRequestError) as bad_key:
        client.chat.completions.create(model=tiny_model, messages=messages, max_tokens=4,
                                       extra_body={"session_id": 42})
    assert bad_key.value.body["param"] == "session_id"


def test_stats_blocks(app, tiny_model):
    app.openai().completions.create(model=tiny_model, prompt="Count me", max_tokens=2)
    body = _stats(app)
    assert body["server"]["owner"] == "serve" and body["server"]["model"]
    assert body["batch"]["configured"] == "auto" and body["batch"]["mode"] == "batch" and body["batch"]["batched"]
    assert body["batch"]["max_rows"] == 64 and body["batch"]["kv_budget_bytes"] > 0
    assert body["batch"]["submitted_rows"] >= 1
    for key in ("active_rows", "pending_rows", "kv_bytes", "held_for_memory"):
        assert key in body["batch"]
    assert body["kv_quant"]["mode"] == "float32" and body["kv_quant"]["layers"] == {"float32": 2}
    admission = body["admission"]
    assert admission["enforced_context_tokens"] is None and admission["memory_budget_bytes"] is None
    assert admission["weights_bytes"] > 0 and admission["usable_bytes"] > admission["weights_bytes"]
    assert 0 < admission["max_safe_context"] <= 2048
    assert "ssd_cache" not in body
    flush = app.post("/admin/cache/flush")
    assert flush.status_code == 200 and flush.json()["durable"] and flush.json()["entries"] == 0
    assert app.get("/admin/cache/flush").status_code == 405


def test_metrics_in_prometheus_text(app, tiny_model):
    app.openai().completions.create(model=tiny_model, prompt="Hello", max_tokens=3)
    text = app.get("/metrics")
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    body = text.text
    assert 'hearth_http_requests_total{method="POST",route="v1/completions",status="200"}' in body
    for name in ("hearth_time_to_first_token_seconds_bucket", "hearth_inter_token_latency_seconds_count",
                 "hearth_prompt_tokens_total", "hearth_generated_tokens_total", "hearth_queue_depth",
                 "hearth_active_rows", "hearth_prompt_cache_hits_total", "hearth_prompt_cache_misses_total"):
        assert name in body, name


@pytest.fixture
def narrow(served):
    """One row at a time and a 1,800-token context cap."""
    return served("--batch", "1", "--max-context", "1800")


def test_queue_full_answers_429_in_the_openai_shape(narrow, tiny_model, eos_id):
    url = "/v1/chat/completions"
    hold = {"model": tiny_model, "messages": [{"role": "user", "content": "hold"}], "max_tokens": 1700,
            "logit_bias": {str(eos_id): -100}, "stream": True}
    quick = {"model": tiny_model, "messages": [{"role": "user", "content": "wait"}], "max_tokens": 1}
    with ThreadPoolExecutor(MAX_QUEUED) as pool:
        with narrow.stream("POST", url, json=hold) as holder:
            next(holder.iter_lines())  # the one row is busy now
            waiting = [pool.submit(narrow.post, url, json=quick) for _ in range(MAX_QUEUED)]
            deadline = time.monotonic() + 30
            while _stats(narrow)["admission"]["queued"] < MAX_QUEUED:
                assert time.monotonic() < deadline, "the queue never filled"
                time.sleep(0.05)
            refused = narrow.post(url, json=quick)
        done = [w.result() for w in waiting]  # the holder left; everyone waiting is served
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("resource_admission", "queue_full") and error["message"]
    assert [r.status_code for r in done] == [200] * MAX_QUEUED
    assert all(r.json()["usage"]["lane"] == "serial" for r in done)


def test_context_over_budget_and_capped_max_tokens(narrow, tiny_model):
    client = narrow.openai()
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=tiny_model, prompt=LONG_TEXT * 3, max_tokens=5)
    error = refused.value.body
    assert (error["type"], error["code"]) == ("memory_admission", "context_over_budget")
    assert "1800" in error["message"]
    assert _stats(narrow)["admission"]["enforced_context_tokens"] == 1800
    fits = client.completions.create(model=tiny_model, prompt=LONG_TEXT * 2, max_tokens=5000,
                                     extra_body={"logit_bias": {}})
    assert fits.usage.prompt_tokens + fits.usage.completion_tokens <= 1800


def test_ssd_cache_survives_a_restart(homes, tiny_model, tmp_path):
    ssd = tmp_path / "ssd"
    args = (tiny_model, "--ssd-cache", str(ssd), "--no-worker")
    first_prompt = "Persist me. " + LONG_TEXT
    second_prompt = "Flushed at shutdown. " + LONG_TEXT

    server = ServerProcess(server_env(*homes), *args, log_path=tmp_path / "a.log").wait_ready()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="local", max_retries=0)
        cold = client.completions.create(model=tiny_model, prompt=first_prompt, max_tokens=4)
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        flush = httpx.post(server.url + "/admin/cache/flush", timeout=60)
        assert flush.status_code == 200, flush.text
        report = flush.json()
        assert report["durable"] and report["entries"] == 1 and report["pendingSnapshots"] == 0
        assert report["longest_durable_prefix_tokens"] >= cold.usage.prompt_tokens
        client.completions.create(model=tiny_model, prompt=second_prompt, max_tokens=4)
    finally:
        assert server.stop() == 0, server.output()  # SIGTERM writes what is still pending
    assert re.search(r"ssd cache: \d+ snapshot\(s\) written in \d+ ms; \d+ entries on disk", server.output())

    server = ServerProcess(server_env(*homes), *args, log_path=tmp_path / "b.log").wait_ready()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="local", max_retries=0)
        remote = httpx.Client(base_url=server.url)
        assert _stats(remote)["ssd_cache"]["entries"] == 2
        warm = client.completions.create(model=tiny_model, prompt=first_prompt, max_tokens=4)
        assert warm.usage.prompt_tokens_details.cached_tokens == warm.usage.prompt_tokens - 1
        assert warm.choices[0].text == cold.choices[0].text
        again = client.completions.create(model=tiny_model, prompt=second_prompt, max_tokens=4)
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
        ssd_stats = _stats(remote)["ssd_cache"]
        assert ssd_stats["restores"] == 2 and ssd_stats["failed_spills"] == 0
    finally:
        assert server.stop() == 0, server.output()
