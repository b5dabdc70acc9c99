"""The Curve Designer's backends on real servers and a real engine:
POST /signal (the histogram, checked against a forward pass of our own),
POST /generate (both modes, seeds, refusals), their CORS, the page, and
exclusive use of the engine on both lanes."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

PROMPT = "Tell me about tides."
FLAT = {"points": [[-20, -20], [0, -20]]}  # every token but the top on the floor: greedy decoding
HTTP = httpx.Client(timeout=120)


# -- /signal --------------------------------------------------------------------------------------

def reference_bins(tiny_model, prompt: str) -> list[int]:
    """The histogram worked out here: mlx-lm's model, the chat template, one forward pass."""
    import mlx.core as mx
    from huggingface_hub import snapshot_download
    from mlx_lm import load

    model, tok = load(snapshot_download(tiny_model, local_files_only=True))
    hf = tok._tokenizer
    text = hf.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    logits = model(mx.array([hf.encode(text, add_special_tokens=False)]))[0, -1]
    logprobs = (logits - mx.logsumexp(logits)).tolist()
    bins = [0] * 80
    for v in logprobs:
        bins[min(max(int((v + 20) // 0.25), 0), 79)] += 1
    return bins


def test_signal_is_the_next_token_histogram(base_url, tiny_model):
    r = HTTP.post(base_url + "/signal", json={"prompt": PROMPT})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"bins", "vocab"} and body["vocab"] == 320
    assert len(body["bins"]) == 80 and all(isinstance(b, int) for b in body["bins"])
    assert sum(body["bins"]) == body["vocab"]
    assert r.headers["access-control-allow-origin"] == "*"
    want = reference_bins(tiny_model, PROMPT)
    # A token right on a bucket's edge may land on either side of it in another float order.
    assert sum(abs(a - b) for a, b in zip(body["bins"], want, strict=True)) <= 2, (body["bins"], want)


@pytest.mark.parametrize("raw,status,message", [
    (b"{not json", 400, "invalid JSON"),
    (b"[1, 2]", 400, "invalid JSON"),
    (b'{"prompt": ""}', 400, "prompt must be a non-empty string"),
    (b'{"prompt": 7}', 400, "prompt must be a non-empty string"),
])
def test_signal_refusals(base_url, raw, status, message):
    r = HTTP.post(base_url + "/signal", content=raw, headers={"content-type": "application/json"})
    error = r.json()["error"]
    assert r.status_code == status and error["message"] == message and error["type"] == "invalid_request_error"
    assert r.headers["access-control-allow-origin"] == "*"


# -- /generate ------------------------------------------------------------------------------------

def generate(base_url: str, **fields) -> dict:
    r = HTTP.post(base_url + "/generate", json={"prompt": PROMPT, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def test_default_mode_uses_the_models_recipe(base_url):
    out = generate(base_url, n=2, max_tokens=12, default=True, curve=FLAT)  # default wins over a curve
    # The tiny model's generation_config.json: temperature 0, top_k 5.
    assert out["mode"] == "default" and out["recipe"] == {"temperature": 0.0, "topP": 0.0, "topK": 5}
    assert out["n"] == 2 and out["seed"] == 0 and len(out["samples"]) == 2
    assert all(set(s) == {"text", "junk"} and isinstance(s["junk"], bool) for s in out["samples"])
    assert out["samples"][0]["text"] == out["samples"][1]["text"]  # greedy
    assert generate(base_url, n=1, max_tokens=12, curve={"points": [[-3, -3]]})["mode"] == "default"  # one point


def test_curve_mode_samples_with_the_drawn_curve(base_url):
    greedy = generate(base_url, n=1, max_tokens=16, default=True)["samples"][0]["text"]
    flat = generate(base_url, n=3, max_tokens=16, curve=FLAT)
    assert flat["mode"] == "curve" and "recipe" not in flat
    assert [s["text"] for s in flat["samples"]] == [greedy] * 3  # only the top token survives the floor

    wide = {"points": [[-20, -10], [0, 0]]}  # temperature 2
    a = generate(base_url, n=4, max_tokens=16, seed=5, curve=wide)
    assert a == generate(base_url, n=4, max_tokens=16, seed=5, curve=wide)  # a seed repeats itself
    texts = [s["text"] for s in a["samples"]]
    assert len(set(texts)) > 1 and greedy not in texts  # samples differ from each other and from greedy
    assert a["seed"] == 5 and a["n"] == 4
    other = generate(base_url, n=4, max_tokens=16, seed=6, curve=wide)
    assert [s["text"] for s in other["samples"]] != texts
    points = generate(base_url, n=1, max_tokens=4, curve={"points": [{"x": -20, "y": -20}, {"x": 0, "y": 0}]})
    assert points["mode"] == "curve"


@pytest.mark.parametrize("fields,message", [
    ({"n": 0}, "n must be an integer from 1 to 8"),
    ({"n": 9}, "n must be an integer from 1 to 8"),
    ({"n": 2.5}, "n must be an integer from 1 to 8"),
    ({"max_tokens": 0}, "max_tokens must be an integer from 1 to 256"),
    ({"max_tokens": 257}, "max_tokens must be an integer from 1 to 256"),
    ({"seed": -1}, "seed must be an integer"),
    ({"default": "yes"}, "default must be a boolean"),
    ({"curve": {"points": [[-20, -5], [-10, -8], [0, 0]]}}, "curve is not monotone: point 1 (y=-8) is below point 0"),
    ({"curve": {"points": [[-5, -5], [-10, -4], [0, 0]]}}, "curve is not monotone: points must come in increasing x"),
    ({"curve": {"points": [[-30, -5], [0, 0]]}}, "curve.points[0] must lie within -20..0"),
    ({"curve": {"points": [[-20, "a"], [0, 0]]}}, "curve.points[0] must be [x, y]"),
    ({"curve": [[-20, -20], [0, 0]]}, "curve must be an object with a list of points"),
    ({"prompt": None}, "prompt must be a non-empty string"),
])
def test_generate_refusals(base_url, fields, message):
    r = HTTP.post(base_url + "/generate", json={"prompt": PROMPT, **fields})
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error"} and r.json()["error"]["message"].startswith(message), r.json()
    assert r.headers["access-control-allow-origin"] == "*"


def test_a_prompt_over_the_context_is_refused(base_url):
    r = HTTP.post(base_url + "/generate", json={"prompt": "tides and moons " * 2000, "max_tokens": 8})
    assert r.status_code == 400 and "does not fit this model's context" in r.json()["error"]["message"]


def test_junk_heuristic():
    from inference.protocols.curve_bodies import junk

    assert not junk("The tide comes in twice a day, pulled by the moon.")
    for text in ("", "   \n", "abc \ufffd def", "the the the the the", "lalalalalala", "#$%^&*@!~`|<>{}[] ok"):
        assert junk(text), text


# -- CORS and the page ----------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/signal", "/generate"])
def test_both_answer_preflights_from_any_origin(base_url, path):
    pre = HTTP.options(base_url + path, headers={"Origin": "https://lab.example",
                                                 "Access-Control-Request-Method": "POST",
                                                 "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code == 204
    assert pre.headers["access-control-allow-origin"] == "*"
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "content-type" in pre.headers["access-control-allow-headers"]
    assert HTTP.get(base_url + path).status_code == 405
    body = {"prompt": "hi"} if path == "/signal" else {"prompt": "hi", "n": 1, "max_tokens": 2}
    cross = HTTP.post(base_url + path, json=body, headers={"Origin": "https://lab.example"})
    assert cross.status_code == 200 and cross.headers["access-control-allow-origin"] == "*"


def test_the_page_is_served_uncached(base_url):
    r = HTTP.get(base_url + "/curves")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert r.headers["cache-control"] == "no-store"
    assert "Curve Designer" in r.text and "/assets/js/curves.js" in r.text
    assert HTTP.get(base_url + "/assets/js/curves.js").status_code == 200


# -- exclusive use of the engine --------------------------------------------------------------------

def test_generate_waits_for_running_requests_over_http(base_url, eos_id):
    """A stream running when /generate arrives ends whole before /generate answers."""
    ended: dict = {}

    def stream():
        body = {"prompt": "Once", "max_tokens": 150, "stream": True, "logit_bias": {str(eos_id): -100},
                "stream_options": {"include_usage": True}}
        with HTTP.stream("POST", base_url + "/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ended.setdefault("first", time.monotonic())
                    chunk = json.loads(line[len("data: "):])
                    for choice in chunk.get("choices") or []:
                        ended["finish"] = choice.get("finish_reason") or ended.get("finish")
                    if chunk.get("usage"):
                        ended["tokens"] = chunk["usage"]["completion_tokens"]
        ended["last"] = time.monotonic()

    runner = threading.Thread(target=stream)
    runner.start()
    deadline = time.monotonic() + 60
    while "first" not in ended and time.monotonic() < deadline:
        time.sleep(0.005)
    out = generate(base_url, n=2, max_tokens=8, curve=FLAT)
    answered = time.monotonic()
    runner.join(60)
    assert out["mode"] == "curve"
    # Counted in tokens, not chunks: a token that ends mid-character sends no chunk of its own.
    assert (ended["finish"], ended["tokens"]) == ("length", 150) and ended["last"] <= answered


async def _events(submission) -> list[tuple[float, object]]:
    return [(time.monotonic(), e) async for e in submission.events()]


def _long(eos: int, n: int):
    from inference.engine.types import GenerationRequest, LogitsParams

    return GenerationRequest(prompt_tokens=[5, 6, 7, 8], max_tokens=n, logits=LogitsParams(logit_bias={eos: -100.0}))


@pytest.fixture(scope="module", params=[8, 1], ids=["batched", "serial"])
def engine(request, tiny_model):
    from inference.engine.engine import Engine, EngineConfig

    engine = Engine(tiny_model, EngineConfig(batch=request.param))
    engine.start()
    yield engine
    engine.close(drain_seconds=0)


def test_a_solo_call_runs_alone_and_requests_wait_for_it(engine, eos_id):
    """Rows running when the call arrives finish first; requests arriving meanwhile wait until it returns."""
    seen: dict = {}

    def solo():
        seen["start"], seen["active"], seen["queued"] = time.monotonic(), engine.active_rows, engine.queued
        time.sleep(0.3)  # long enough that a request decoding beside it would show
        seen["end"] = time.monotonic()
        return "done"

    async def main():
        first = engine.submit(_long(eos_id, 400))
        running = asyncio.create_task(_events(first))
        while engine.active_rows == 0:
            await asyncio.sleep(0.001)
        future = asyncio.wrap_future(engine.exclusive(solo))
        await asyncio.sleep(0.05)
        later = engine.submit(_long(eos_id, 5))  # arrives while the call waits
        return await running, await future, await _events(later)

    first, result, later = asyncio.run(main())
    assert result == "done"
    assert seen["active"] == 0 and seen["queued"] == 1  # nothing decoding; the later request held back
    assert first[-1][1].final_usage.completion_tokens == 400  # the running row finished whole ...
    assert first[0][0] < seen["start"]  # ... having started before the call
    assert later[0][0] > seen["end"]  # the later request's first token came after the call returned
    assert later[-1][1].final_usage.completion_tokens == 5


def test_a_cancelled_solo_call_lets_requests_through(engine, eos_id):
    ran = []

    async def main():
        first = engine.submit(_long(eos_id, 200))
        running = asyncio.create_task(_events(first))
        while engine.active_rows == 0:
            await asyncio.sleep(0.001)
        future = engine.exclusive(lambda: ran.append(1))
        await asyncio.sleep(0.02)
        assert future.cancel()
        later = await _events(engine.submit(_long(eos_id, 3)))
        return await running, later

    first, later = asyncio.run(main())
    assert not ran
    if engine.capacity > 1:  # batched: the later request ran beside the first instead of waiting behind a call
        assert later[-1][0] < first[-1][0]
    assert later[-1][1].final_usage.completion_tokens == 3 and first[-1][1].final_usage.completion_tokens == 200


def test_a_failing_solo_call_reports_its_error(engine):
    def boom():
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        engine.exclusive(boom).result(timeout=30)
    assert engine.exclusive(lambda: 41 + 1).result(timeout=30) == 42  # the engine goes on
