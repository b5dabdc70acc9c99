"""Every sampling and penalty field, checked token for token against
mlx-lm's own samplers and processors run in this process on the same model."""
import math

import httpx
import openai
import pytest

PROMPT = "The quick brown"
N = 12


@pytest.fixture(scope="module")
def reference(tiny_model):
    """The tiny model loaded with mlx-lm directly, for hand-made references."""
    from huggingface_hub import snapshot_download
    from mlx_lm import load

    model, tokenizer = load(snapshot_download(tiny_model, local_files_only=True))
    return model, tokenizer


def mlx_lm_tokens(reference, seed=None, sampler_args=None, processor_args=None, n=N):
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    from inference.engine import fastmath

    fastmath.restore()  # mlx-lm's own SwiGLU, whatever an in-process engine of an earlier test put in
    model, tok = reference
    if seed is not None:
        mx.random.seed(seed)
    sampler = make_sampler(**(sampler_args or {}))
    processors = make_logits_processors(**(processor_args or {}))
    out = []
    for token, _ in generate_step(mx.array(tok.encode(PROMPT)), model, max_tokens=n, sampler=sampler,
                                  logits_processors=processors):
        out.append(token)
    return out


def served_tokens(base_url, eos_id, **fields):
    body = {"prompt": PROMPT, "max_tokens": N, "logprobs": True, **fields}
    body.setdefault("logit_bias", {})
    body["logit_bias"] = {str(eos_id): -100.0, **body["logit_bias"]}
    r = httpx.post(base_url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return [e["id"] for e in r.json()["choices"][0]["logprobs"]["content"]]


def test_greedy_matches_mlx_lm(base_url, eos_id, reference):
    ours = served_tokens(base_url, eos_id, temperature=0)
    theirs = mlx_lm_tokens(reference, processor_args={"logit_bias": {eos_id: -100.0}})
    assert ours == theirs


SAMPLED = [
    ({"temperature": 1.5, "top_k": 0}, {"temp": 1.5}),
    ({"temperature": 1.5, "top_k": 3}, {"temp": 1.5, "top_k": 3}),
    ({"temperature": 1.5, "top_k": 0, "top_p": 0.5}, {"temp": 1.5, "top_p": 0.5}),
    ({"temperature": 1.5, "top_k": 0, "min_p": 0.2}, {"temp": 1.5, "min_p": 0.2}),
    ({"temperature": 1.0, "top_k": 0, "xtc_probability": 1.0, "xtc_threshold": 0.01},
     {"temp": 1.0, "xtc_probability": 1.0, "xtc_threshold": 0.01}),
]


@pytest.mark.parametrize("fields,sampler_args", SAMPLED)
def test_sampler_fields_match_mlx_lm(base_url, eos_id, reference, tiny_model, fields, sampler_args):
    from tests.helpers import newline_and_eos

    ours = served_tokens(base_url, eos_id, seed=42, **fields)
    if "xtc_probability" in sampler_args:
        sampler_args = {**sampler_args, "xtc_special_tokens": newline_and_eos(reference[1])}
    theirs = mlx_lm_tokens(reference, 42, sampler_args, {"logit_bias": {eos_id: -100.0}})
    assert ours == theirs


@pytest.mark.parametrize("fields", [f for f, _ in SAMPLED[1:]])
def test_each_sampler_field_changes_the_output(base_url, eos_id, fields):
    """The same seed without the field gives other tokens, so it was not ignored."""
    base = {k: v for k, v in fields.items() if k in ("temperature", "top_k")}
    if fields.get("top_k"):
        base["top_k"] = 0
    runs = [(served_tokens(base_url, eos_id, seed=s, **fields), served_tokens(base_url, eos_id, seed=s, **base))
            for s in range(4)]
    assert any(a != b for a, b in runs)


def test_top_k_1_is_greedy(base_url, eos_id):
    assert served_tokens(base_url, eos_id, temperature=2.0, top_k=1, seed=3) == \
        served_tokens(base_url, eos_id, temperature=0)


def test_seed_reproduces_and_other_seeds_differ(base_url, eos_id):
    a = served_tokens(base_url, eos_id, temperature=1.5, top_k=0, seed=7)
    assert a == served_tokens(base_url, eos_id, temperature=1.5, top_k=0, seed=7)
    assert any(a != served_tokens(base_url, eos_id, temperature=1.5, top_k=0, seed=s) for s in (8, 9, 10))


def test_logit_bias_forces_a_token(base_url, eos_id):
    assert served_tokens(base_url, eos_id, logit_bias={"17": 100}) == [17] * N


PENALTIES = [
    {"repetition_penalty": 1.8, "repetition_context_size": 5},
    {"presence_penalty": 3.0, "presence_context_size": 8},
    {"frequency_penalty": 2.5, "frequency_context_size": 0},
]


@pytest.mark.parametrize("fields", PENALTIES)
def test_penalties_match_mlx_lm_processors(base_url, eos_id, reference, fields):
    ours = served_tokens(base_url, eos_id, temperature=0, **fields)
    theirs = mlx_lm_tokens(reference, processor_args={"logit_bias": {eos_id: -100.0}, **fields})
    assert ours == theirs
    assert ours != served_tokens(base_url, eos_id, temperature=0)  # the penalty did something


def test_logprobs_equal_a_direct_forward(base_url, eos_id, reference):
    import mlx.core as mx

    model, tok = reference
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "top_logprobs": 4,
            "logit_bias": {str(eos_id): -100.0}}
    content = httpx.post(base_url + "/v1/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    ids = tok.encode(PROMPT)
    for entry in content:
        logits = model(mx.array([ids]))[0, -1]
        logits[eos_id] = logits[eos_id] - 1e9  # the request's bias, applied by hand
        logprobs = logits - mx.logsumexp(logits)
        top = sorted(range(logprobs.shape[0]), key=lambda i: -logprobs[i].item())[:4]
        assert [t["id"] for t in entry["top_logprobs"]] == top
        for t in entry["top_logprobs"]:
            assert math.isclose(t["logprob"], logprobs[t["id"]].item(), abs_tol=1e-4)
            text = tok.decode([t["id"]])  # the token's text and bytes, as the tokenizer decodes it alone
            assert bytes(t["bytes"]).decode("utf-8", "replace").strip() == text.strip()
            assert t["token"].strip() == text.strip() or t["token"].startswith("bytes:")
        assert {k: v for k, v in entry.items() if k != "top_logprobs"} == entry["top_logprobs"][0]
        ids.append(entry["id"])  # greedy: the chosen token is the top one


def test_logprobs_in_openais_shape_streamed_or_not(base_url):
    """Each entry: the token's text and UTF-8 bytes, its logprob, top_logprobs always (empty unless asked);
    a stream sends each entry with the chunk that carries its text (the SDK reads them the same way)."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": True}
    r = httpx.post(base_url + "/v1/chat/completions", json=body).json()
    entries = r["choices"][0]["logprobs"]["content"]
    assert len(entries) == 3 and all(set(e) == {"id", "token", "bytes", "logprob", "top_logprobs"} for e in entries)
    assert all(e["top_logprobs"] == [] and isinstance(e["bytes"], list) for e in entries)
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="x")
    streamed = [lp for chunk in client.chat.completions.create(**body, model="m", stream=True)
                if chunk.choices and chunk.choices[0].logprobs for lp in chunk.choices[0].logprobs.content]
    assert [(e.token, e.bytes, e.logprob) for e in streamed] == [(e["token"], e["bytes"], e["logprob"])
                                                                 for e in entries]
    top = client.chat.completions.create(**body, model="m", top_logprobs=2).choices[0].logprobs.content
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in top)


def test_completions_logprobs_take_the_legacy_count_and_answer_the_legacy_columns(base_url):
    r = httpx.post(base_url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "logprobs": 2}).json()
    block = r["choices"][0]["logprobs"]
    assert len(block["tokens"]) == len(block["token_logprobs"]) == len(block["top_logprobs"]) == 3
    assert all(len(top) <= 2 for top in block["top_logprobs"]) and block["text_offset"][0] == 0
    assert "".join(block["tokens"]) == r["choices"][0]["text"] or "bytes:" in "".join(block["tokens"])


def test_completions_go_on_from_the_prompts_text_keeping_a_first_tokens_leading_space(base_url, tiny_model):
    """A completion continues the prompt's text: its first token's leading space is kept (mlx-lm's detokenizer
    drops it from a reply's first word), and `text_offset` counts the text's characters, that space included."""
    from huggingface_hub import try_to_load_from_cache
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(try_to_load_from_cache(tiny_model, "tokenizer.json")))
    spaced = next(i for i in range(tok.get_vocab_size())
                  if (t := tok.id_to_token(i)).startswith("\u0120") and t[1:].isalpha() and len(t) > 2)
    word = " " + tok.id_to_token(spaced)[1:]
    body = {"prompt": "Hi", "max_tokens": 2, "logprobs": 1, "temperature": 0, "logit_bias": {str(spaced): 100}}
    choice = httpx.post(base_url + "/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == word * 2 and choice["logprobs"]["text_offset"] == [0, len(word)]


def test_completions_text_offset_counts_the_texts_characters_across_a_stream():
    """`text_offset` is where each token's text starts in the choice's text, over the whole stream: a byte
    that starts no character is the one U+FFFD the text shows, a character split over tokens starts at its
    first (not the length of the label `bytes:\\x83`); each choice of a stream keeps its own count."""
    from inference.protocols.openai_reply import Reply

    def entry(raw: bytes) -> dict:
        return {"token": raw.decode("utf-8", "replace"), "logprob": -1.0, "top_logprobs": [], "bytes": list(raw)}

    tokens = [b"\x1c", b"\x83", b"C", b" you", b"\xc3", b"\xa9!", b")"]  # text: "\x1c\ufffdC you\u00e9!)"
    whole = Reply("text", "m").logprobs_block([entry(t) for t in tokens])
    assert whole is not None and whole["text_offset"] == [0, 1, 2, 3, 7, 7, 9]
    streamed = Reply("text", "m")
    first = streamed.logprobs_block([entry(t) for t in tokens[:3]], index=0)
    other = streamed.logprobs_block([entry(b"ab")], index=1)
    rest = streamed.logprobs_block([entry(t) for t in tokens[3:]], index=0)
    assert first is not None and other is not None and rest is not None
    assert first["text_offset"] + rest["text_offset"] == whole["text_offset"] and other["text_offset"] == [0]


@pytest.mark.parametrize("fields,message", [
    ({"logprobs": "yes"}, "logprobs must be of type bool"),
    ({"top_logprobs": "3"}, "top_logprobs must be of type int"),
    ({"top_logprobs": 2.0}, "top_logprobs must be of type int"),
    ({"top_logprobs": -2}, "top_logprobs must be at least 0"),
    ({"top_logprobs": 12}, "top_logprobs must be at most 11"),
])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_logprobs_validation_messages(base_url, path, fields, message):
    body = {"messages": [{"role": "user", "content": "x"}], "prompt": "x", "max_tokens": 1, **fields}
    r = httpx.post(base_url + path, json=body)
    assert r.status_code == 400 and r.json()["error"]["message"] == message


def test_top_logprobs_minus_one_is_unset(base_url):
    r = httpx.post(base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "top_logprobs": -1})
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("field,value", [("repetition_penalty", -1), ("presence_penalty", "x"),
                                         ("frequency_context_size", -3), ("xtc_probability", 1.5),
                                         ("xtc_threshold", -0.1), ("repetition_context_size", 2.5)])
def test_penalty_and_xtc_fields_are_checked(base_url, field, value):
    r = httpx.post(base_url + "/v1/completions", json={"prompt": "x", field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
