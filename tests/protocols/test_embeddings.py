"""/v1/embeddings through the openai SDK: unit vectors equal to a direct
forward of the same model, float and base64 encodings, the instruction
format, clear refusals, and long inputs embedded in turns of the engine
thread no longer than a prefill chunk."""
from __future__ import annotations

import base64

import httpx
import mlx.core as mx
import numpy as np
import pytest


@pytest.fixture(scope="module")
def embed_server(served):
    return served("--embeddings")


def direct(tiny_model, text: str) -> np.ndarray:
    from mlx_lm import load

    model, tokenizer = load(tiny_model)
    hidden = model.model(mx.array([tokenizer.encode(text)]))[0, -1].astype(mx.float32)
    return np.array(hidden / mx.linalg.norm(hidden))


def test_vectors_match_a_direct_forward(embed_server, tiny_model):
    client = embed_server.openai()
    texts = ["the cat sat on the mat", "a kitten by the window, and a much longer sentence than the first"]
    for fmt in ("float", "base64"):
        r = client.embeddings.create(model="m", input=texts, encoding_format=fmt)
        assert [d.index for d in r.data] == [0, 1] and r.usage.prompt_tokens == r.usage.total_tokens > 0
        for d, text in zip(r.data, texts, strict=True):
            raw = d.embedding
            v = np.frombuffer(base64.b64decode(raw), dtype="<f4") if fmt == "base64" else np.array(raw, np.float32)
            assert abs(np.linalg.norm(v) - 1) < 1e-5
            np.testing.assert_allclose(v, direct(tiny_model, text), atol=1e-5)
    default = client.embeddings.create(model="m", input="the cat sat on the mat")  # the SDK asks for base64
    np.testing.assert_allclose(default.data[0].embedding, direct(tiny_model, "the cat sat on the mat"), atol=1e-5)


def test_instruction_format(embed_server, tiny_model):
    r = embed_server.post("/v1/embeddings",
                           json={"input": "cats", "instruction": "Find pets"}).json()
    np.testing.assert_allclose(r["data"][0]["embedding"], direct(tiny_model, "Instruct: Find pets\nQuery:cats"),
                               atol=1e-5)


def test_token_arrays_embed_as_their_text_does(embed_server, tiny_model):
    """langchain's OpenAIEmbeddings sends the text already tokenized: one array of ids, or an array of them."""
    from mlx_lm import load

    _, tokenizer = load(tiny_model)
    texts = ["the cat sat on the mat", "a kitten by the window"]
    ids = [tokenizer.encode(t) for t in texts]
    client = embed_server.openai()
    many = client.embeddings.create(model="m", input=ids, encoding_format="float")
    one = client.embeddings.create(model="m", input=ids[0], encoding_format="float")
    assert many.usage.prompt_tokens == sum(map(len, ids)) and one.usage.prompt_tokens == len(ids[0])
    for d, text in zip([*many.data, *one.data], [*texts, texts[0]], strict=True):
        np.testing.assert_allclose(d.embedding, direct(tiny_model, text), atol=1e-5)


def test_long_inputs_take_turns_of_a_prefill_chunk_on_the_engine_thread(embed_server, tiny_model, monkeypatch):
    """An input longer than the engine's prefill chunk runs in several turns of the
    engine thread, decode steps of running streams between them (one forward of
    2,000 tokens at once stalled every stream: 32 such inputs held a 16-token
    stream 11.8 s), and its vector is still the whole input's."""
    from mlx_lm import load

    from hearth.root import RUNTIME

    engine = RUNTIME.engine
    chunk = engine.config.prefill_chunk
    model, _ = load(tiny_model)
    rng = np.random.default_rng(5)
    long = [int(t) for t in rng.integers(1, 300, 5 * chunk + 17)]
    inputs = [[5, 6, 7], long, [8, 9]]
    turns = []
    real_call = engine.call

    def counted(fn, timeout=60.0):
        turns.append(fn)
        return real_call(fn, timeout)

    monkeypatch.setattr(engine, "call", counted)
    r = embed_server.openai().embeddings.create(model="m", input=inputs, encoding_format="float")
    assert len(turns) >= 6 + 2  # the long input's six segments, the short ones' turns
    for d, ids in zip(r.data, inputs, strict=True):
        hidden = model.model(mx.array([ids]))[0, -1].astype(mx.float32)
        np.testing.assert_allclose(d.embedding, np.array(hidden / mx.linalg.norm(hidden)), atol=1e-4)


@pytest.mark.parametrize("body, param", [
    ({"input": [1, "x"]}, "input[0]"), ({"input": [[1, 2], []]}, "input[1]"), ({"input": [[1, 10 ** 9]]}, "input[0]"),
    ({"input": [[1, 2.5]]}, "input[0]"), ({"input": [1, 2], "instruction": "Find"}, "instruction"),
    ({"input": []}, "input"), ({"input": {"a": 1}}, "input"),
    ({"input": [""]}, "input[0]"), ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "dimensions": 8}, "dimensions"),
])
def test_bad_input(embed_server, body, param):
    r = embed_server.post("/v1/embeddings", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_refused_on_a_chat_model(base_url):
    r = httpx.post(base_url + "/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and "not an embedding model" in err["message"]


def _encode_watched(monkeypatch, watch) -> None:
    """The served tokenizer's `encode` calls `watch(text)` on the thread that tokenizes, then encodes."""
    from hearth.root import RUNTIME

    tokenizer = RUNTIME.engine.loaded_model.tokenizer._tokenizer
    real = type(tokenizer).encode

    def encode(self, text, *args, **kwargs):
        watch(text)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "encode", encode)


def test_large_texts_are_tokenized_as_large_prompts_are(embed_server, monkeypatch):
    """Texts of more than `prompt_work.LARGE_CHARS` characters in all are
    tokenized on the large prompts' thread, one build at a time and counted
    with them (2,048 strings of ~1,000 characters tokenized on the loop's
    pool held a 16-token stream beside them 2.5 s), and refused as a full
    queue past `MAX_LARGE`; the tokens are still checked against the window."""
    import threading

    from inference.protocols import prompt_work

    threads: list[str] = []
    _encode_watched(monkeypatch, lambda text: threads.append(threading.current_thread().name))
    body = {"input": ["word " * 8_000, "the cat sat " * 6_000], "encoding_format": "float"}  # 112,000 characters
    r = embed_server.post("/v1/embeddings", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input" and "input[0]" in r.json()["error"]["message"]
    assert threads == ["hearth-large-prompt_0"] * 2
    monkeypatch.setattr(prompt_work, "MAX_LARGE", 0)
    full = embed_server.post("/v1/embeddings", json=body)
    assert full.status_code == 429, full.text
    assert (full.json()["error"]["type"], full.json()["error"]["code"]) == ("resource_admission", "queue_full")
    small = embed_server.post("/v1/embeddings", json={"input": ["the cat"]})  # not a large build: not counted
    assert small.status_code == 200 and len(threads) == 3 and threads[-1] != "hearth-large-prompt_0"


def test_requests_past_the_bound_are_refused_as_a_full_queue(embed_server, monkeypatch):
    """Each request taken holds its body and tokens, and takes engine turns:
    past `MAX_TAKEN` served at once the next is a 429 queue_full in OpenAI's
    shape, at once (50 clients of 2,048 strings were all taken before); a
    chat is not counted, and a place comes back when a request ends."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from inference.protocols import embeddings

    inside, release = threading.Event(), threading.Event()

    def hold(text: str) -> None:
        if text == "held":
            inside.set()
            release.wait(60)  # the first request stays taken until the refusal below is in

    _encode_watched(monkeypatch, hold)
    monkeypatch.setattr(embeddings, "MAX_TAKEN", 1, raising=False)  # one held request fills the bound
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(embed_server.post, "/v1/embeddings", json={"input": "held"})
        assert inside.wait(60)
        try:
            refused = embed_server.post("/v1/embeddings", json={"input": "the cat sat"})
            chat = embed_server.post("/v1/chat/completions",
                                     json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        finally:
            release.set()
        first = held.result(timeout=120)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("resource_admission", "queue_full") and "1 embeddings" in error["message"]
    assert chat.status_code == 200 and first.status_code == 200
    again = embed_server.post("/v1/embeddings", json={"input": "the cat sat"})
    assert again.status_code == 200
