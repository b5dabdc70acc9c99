"""Trace ids and per-phase timings (serving/traces.py), in-process: every
answer carries `X-Hearth-Trace-Id` (the request's own, or a new one), a
malformed one is a 400 in the caller's shape naming the header, and each
generation logs one line with its trace id and phases and lands in
/stats' `phases`."""
from __future__ import annotations

import logging
import re

import pytest

HEADER = "X-Hearth-Trace-Id"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def app(served):
    return served("--no-worker")


def test_every_answer_carries_a_trace_id(app, tiny_model):
    made = app.get("/health").headers[HEADER]
    assert re.fullmatch(r"[0-9a-f]{16}", made) and app.get("/health").headers[HEADER] != made
    sent = app.post("/v1/chat/completions", json={"model": tiny_model, "messages": HI, "max_tokens": 2},
                    headers={HEADER: "client-run:7.a"})
    assert sent.status_code == 200 and sent.headers[HEADER] == "client-run:7.a"
    missing = app.get("/v1/no-such-route", headers={HEADER: "t-404"})
    assert missing.status_code == 404 and missing.headers[HEADER] == "t-404"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/api/jobs"])
@pytest.mark.parametrize("bad", ["has space", "x" * 129, "semi;colon"])
def test_a_malformed_trace_id_is_refused_in_the_callers_shape(app, path, bad):
    r = app.post(path, json={}, headers={HEADER: bad})
    assert r.status_code == 400 and re.fullmatch(r"[0-9a-f]{16}", r.headers[HEADER])
    body = r.json()
    if path == "/api/jobs":
        assert body["ok"] is False and HEADER in body["error"]
    elif path == "/v1/messages":
        assert body["type"] == "error" and HEADER in body["error"]["message"]
    else:
        assert body["error"]["param"] == HEADER


def test_each_generation_logs_its_phases_and_stats_keeps_them(app, tiny_model, caplog, monkeypatch):
    from hearth.root import RUNTIME
    from serving.traces import Phases

    # This test's generations only: the files a worker ran before share the process's runtime, and enough
    # one-token generations among them would put the median decode time at 0.
    monkeypatch.setattr(RUNTIME, "phases", Phases())
    before = app.get("/stats").json()["phases"]["requests"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with caplog.at_level(logging.INFO, logger="hearth.requests"):
        plain = app.post("/v1/chat/completions", headers={HEADER: "plain-1"},
                         json={"model": tiny_model, "messages": HI, "max_tokens": 6})
        assert plain.status_code == 200
        with app.stream("POST", "/v1/completions", headers={HEADER: "streamed-1"},
                        json={"model": tiny_model, "prompt": "Hi", "max_tokens": 6, "stream": True}) as r:
            assert r.status_code == 200 and b"[DONE]" in b"".join(r.iter_bytes())
        guided = app.post("/v1/chat/completions", headers={HEADER: "json-1"},
                          json={"model": tiny_model, "messages": HI, "max_tokens": 12,
                                "response_format": {"type": "json_schema",
                                                    "json_schema": {"name": "a", "schema": schema}}})
        assert guided.status_code == 200
    lines = {m.split()[0]: m for m in (r.getMessage() for r in caplog.records if r.name == "hearth.requests")}
    assert set(lines) >= {"trace=plain-1", "trace=streamed-1", "trace=json-1"}, lines
    assert "POST /v1/completions finish=length prompt=" in lines["trace=streamed-1"]

    def phase(line: str, name: str) -> float:
        return float(re.search(rf"\b{name}=([0-9.e+-]+)", line).group(1))

    for line in lines.values():
        assert phase(line, "decode_ms") > 0 and phase(line, "prefill_ms") > 0 and phase(line, "queue_ms") >= 0
    assert phase(lines["trace=json-1"], "grammar_ms") > 0 and phase(lines["trace=json-1"], "grammar_wait_ms") > 0
    assert phase(lines["trace=plain-1"], "grammar_ms") == 0 and phase(lines["trace=plain-1"], "detokenize_ms") > 0
    stats = app.get("/stats").json()["phases"]
    assert stats["requests"] == before + 3
    assert stats["decode"]["p50_ms"] > 0 and stats["decode"]["p95_ms"] >= stats["decode"]["p50_ms"]
    assert set(stats) == {"requests", "queue", "grammar_wait", "prefill", "decode", "grammar", "detokenize"}


def test_props_answer_in_llama_cpps_shape(served, tiny_model):
    app = served("--no-worker", "--max-tokens", "48", "--temperature", "0.3", "--thinking", "off")
    props = app.get("/props").json()
    assert props["model_alias"] == tiny_model and props["model_path"].endswith(props["model_path"].split("/")[-1])
    assert props["default_generation_settings"]["n_ctx"] == 2048 and props["total_slots"] >= 1
    params = props["default_generation_settings"]["params"]
    assert params["n_predict"] == 48 and params["temperature"] == 0.3 and params["enable_thinking"] is False
    assert (params["top_p"], params["min_p"]) == (1.0, 0.0)  # off, in llama.cpp's terms
    assert "<|im_start|>" in props["chat_template"] and props["modalities"] == {"vision": False, "audio": False}
    assert props["build_info"].startswith("hearth ")
    refused = app.post("/props", json={"n_predict": 1})
    assert refused.status_code == 405 and "GET" in refused.json()["error"]["message"]
    assert served("--no-worker").get("/props").json()["default_generation_settings"]["params"]["n_predict"] == -1


def test_aliases_and_tags_in_single_model_mode(served, tiny_model):
    from tests.inproc import refusal

    app = served("--no-worker", "--alias", "tiny, small,tiny", "--tags", "test,cpu")
    (row,) = [r for r in app.get("/v1/models").json()["data"] if r["id"] == tiny_model]
    assert row["aliases"] == ["tiny", "small"] and row["tags"] == ["test", "cpu"]
    assert app.get("/v1/models/small").json()["id"] == tiny_model
    assert app.get("/v1/models/nobody").status_code == 404
    assert "set `alias` in that model's section of --models-preset" in refusal("--alias", "x")  # router mode
    assert "set `tags` in" in refusal("--tags", "x")
