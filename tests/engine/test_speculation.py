"""Speculative decoding in the engine, in-process on the tiny model: prompt
lookup and a draft model give, at temperature 0, exactly the tokens plain
decoding gives; a lone request drafts, a second one moves it to the batch;
ineligible requests decode plainly; usage and /stats count the drafts."""
from __future__ import annotations

import asyncio

import pytest

from inference.engine.engine import Engine, EngineConfig
from inference.engine.errors import EngineError
from inference.engine.grammar import GrammarSpec
from inference.engine.speculate import NgramDrafter
from inference.engine.types import GenerationRequest, LogitsParams, SamplingParams
from tests.helpers import collect


def _copy_prompt(seed: int) -> list[int]:
    """A span said twice and begun a third time: prompt lookup has something to copy."""
    span = [(seed * 37 + i * 11) % 250 + 3 for i in range(30)]
    return span + [5] + span + [5] + span[:4]


def _request(prompt, eos_id, **kw) -> GenerationRequest:
    kw.setdefault("max_tokens", 48)
    kw.setdefault("logits", LogitsParams(logit_bias={eos_id: -100.0}))
    return GenerationRequest(list(prompt), **kw)


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    drafter = NgramDrafter(4)
    drafter.start([])
    history = [1, 2, 3, 4, 5, 6, 9, 9, 2, 3]
    assert drafter.propose(history, 4) == [4, 5, 6, 9]  # "2 3" was followed by 4 5 6 9
    assert drafter.propose(history + [7], 4) == []  # 7 never occurred before
    drafter.start([])  # a new row
    assert drafter.propose([8, 1, 8, 1, 8], 3) == [1, 8]  # "8 1 8" ended at 2: what followed, cut at the end


@pytest.mark.parametrize("config", [dict(draft_kind="ngram"), dict(draft_kind="ngram", batch=1),
                                    dict(draft_kind="ngram", draft_tokens=2)],
                         ids=["ngram", "ngram-serial", "ngram-2"])
def test_greedy_output_is_token_for_token_plain_decoding(engines, eos_id, config):
    plain = engines(prompt_cache_bytes=0)
    spec = engines(prompt_cache_bytes=0, **config)
    cases = [
        dict(max_tokens=48),
        dict(max_tokens=40, logprobs=True, top_logprobs=3),
        dict(max_tokens=40, logits=LogitsParams(logit_bias={eos_id: -100.0}, repetition_penalty=1.2,
                                                frequency_penalty=0.2)),
        dict(max_tokens=7),
        dict(max_tokens=40, stop=["e"]),
    ]
    drafted = accepted = 0
    for seed, kw in enumerate(cases):
        prompt = _copy_prompt(seed)
        want = asyncio.run(collect(plain, _request(prompt, eos_id, **kw)))
        got = asyncio.run(collect(spec, _request(prompt, eos_id, **kw)))
        assert got["tokens"] == want["tokens"] and got["text"] == want["text"] and got["finish"] == want["finish"]
        assert got["usage"].completion_tokens == want["usage"].completion_tokens
        for a, b in zip(got["logprobs"], want["logprobs"], strict=True):
            assert a["id"] == b["id"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-4)
        s = got["usage"].speculation
        assert s is not None and s["targetCalls"] >= 1 and 0 <= s["accepted"] <= s["drafted"]
        assert s["targetCalls"] + s["accepted"] >= got["usage"].completion_tokens
        drafted += s["drafted"]
        accepted += s["accepted"]
        assert got["usage"].lane == ("serial+spec" if s["accepted"] else "serial")
    assert accepted > 0 and drafted > accepted / 2  # the random model does repeat itself; lookup finds it


def test_a_draft_model_gives_the_same_tokens_and_is_mostly_right_about_itself(engines, eos_id, tiny_model):
    plain = engines(prompt_cache_bytes=0)
    spec = engines(prompt_cache_bytes=0, draft_model=tiny_model)  # the model drafting for itself
    assert spec.speculation == "model" and spec.draft is not None
    for seed in range(3):
        prompt = _copy_prompt(seed + 10)
        want = asyncio.run(collect(plain, _request(prompt, eos_id, max_tokens=30)))
        got = asyncio.run(collect(spec, _request(prompt, eos_id, max_tokens=30)))
        assert got["tokens"] == want["tokens"]
        s = got["usage"].speculation
        assert s["drafted"] > 0 and s["accepted"] >= 0.8 * s["drafted"]


def test_the_cache_a_speculating_row_leaves_serves_the_next_request(engines, eos_id):
    spec = engines(draft_kind="ngram")
    prompt = _copy_prompt(21)
    first = asyncio.run(collect(spec, _request(prompt, eos_id, max_tokens=25)))
    again = asyncio.run(collect(spec, _request(prompt, eos_id, max_tokens=25)))
    assert again["tokens"] == first["tokens"] and again["usage"].cached_tokens == len(prompt) - 1
    longer = prompt + first["tokens"][:-1]
    follow = asyncio.run(collect(spec, _request(longer, eos_id, max_tokens=5)))
    assert follow["usage"].cached_tokens >= len(prompt)


def test_ineligible_and_opted_out_requests_decode_plainly(engines, eos_id):
    spec = engines(prompt_cache_bytes=0, draft_kind="ngram")
    prompt = _copy_prompt(3)
    out = asyncio.run(collect(spec, _request(prompt, eos_id, speculative=False)))
    assert out["usage"].speculation is None and out["usage"].lane == "serial"  # alone: plain steps
    grammar = spec.loaded.grammar_compiler
    compiled = grammar.compile(GrammarSpec("regex", "[a-z]{3,12}!"))
    out = asyncio.run(collect(spec, _request(prompt, eos_id, grammar=grammar.state(compiled))))
    assert out["usage"].speculation is None


def test_a_second_request_moves_the_speculating_row_into_the_batch(engines, eos_id):
    plain = engines(prompt_cache_bytes=0)
    spec = engines(prompt_cache_bytes=0, draft_kind="ngram")
    long = _request(_copy_prompt(30), eos_id, max_tokens=120)
    other = _request(_copy_prompt(31), eos_id, max_tokens=20)
    want = [asyncio.run(collect(plain, r)) for r in (long, other)]

    async def staggered():
        first = asyncio.create_task(collect(spec, _request(long.prompt_tokens, eos_id, max_tokens=120)))
        while not (spec.lane.row is not None and spec.lane.row.spec["targetCalls"]):  # until it has drafted
            await asyncio.sleep(0.001)
        second = await collect(spec, _request(other.prompt_tokens, eos_id, max_tokens=20))
        return await first, second

    first, second = asyncio.run(staggered())
    assert first["tokens"] == want[0]["tokens"] and second["tokens"] == want[1]["tokens"]
    assert first["usage"].lane == "batched" and first["usage"].speculation["targetCalls"] >= 1
    assert second["usage"].speculation is None


def test_a_seeded_sampled_request_draws_what_plain_decoding_draws(engines, eos_id):
    """One draw per verified position with the key plain decoding uses for
    that token: a seeded request is the same with or without speculation."""
    plain = engines(prompt_cache_bytes=0)
    spec = engines(prompt_cache_bytes=0, draft_kind="ngram")
    for sampling in (SamplingParams(temperature=0.8, top_k=20, seed=5),
                     SamplingParams(temperature=0.6, top_p=0.9, min_p=0.05, seed=6),
                     SamplingParams(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.1, seed=7)):
        want = asyncio.run(collect(plain, _request(_copy_prompt(7), eos_id, sampling=sampling)))
        got = asyncio.run(collect(spec, _request(_copy_prompt(7), eos_id, sampling=sampling)))
        assert got["tokens"] == want["tokens"] and got["usage"].speculation["targetCalls"] >= 1


def test_stats_count_the_drafts(engines, eos_id):
    from serving.telemetry import _speculation

    spec = engines(prompt_cache_bytes=0, draft_kind="ngram", draft_tokens=5)
    asyncio.run(collect(spec, _request(_copy_prompt(40), eos_id)))
    stats = _speculation(spec)
    assert stats["kind"] == "ngram" and stats["draft_tokens"] == 5 and stats["rows"] >= 1
    assert stats["target_calls"] >= 1 and stats["drafted"] >= stats["accepted"]
    assert _speculation(engines(prompt_cache_bytes=0)) is None


@pytest.mark.parametrize("config, message", [
    (dict(draft_kind="model"), "needs --draft-model"),
    (dict(draft_kind="ngram", kv_quant=8), "cannot run with --kv-quant"),
    (dict(draft_kind="bogus"), "unknown draft kind"),
    (dict(draft_kind="ngram", draft_model="x"), "cannot go with --draft-kind ngram"),
])
def test_draft_settings_that_cannot_work_are_refused_at_start(tiny_model, config, message):
    with pytest.raises(EngineError, match=message):
        Engine(tiny_model, EngineConfig(**config)).start()


def test_the_openai_usage_carries_the_speculation_counts(served, tiny_model, eos_id):
    spec_server = served("--no-worker", "--draft-kind", "ngram")
    client = spec_server.openai()
    text = "one two three four five six seven eight nine ten " * 3
    bias = {str(eos_id): -100}
    done = client.completions.create(model=tiny_model, prompt=text, max_tokens=24, temperature=0, logit_bias=bias)
    usage = done.usage.model_dump()
    assert usage["speculation"]["targetCalls"] >= 1 and usage["lane"] in ("serial", "serial+spec")
    chunks = list(client.chat.completions.create(
        model=tiny_model, messages=[{"role": "user", "content": text}], max_tokens=24, temperature=0, logit_bias=bias,
        stream=True, stream_options={"include_usage": True}))
    last = chunks[-1].usage.model_dump()
    assert last["completion_tokens"] == 24 and last["speculation"]["targetCalls"] >= 1
    plain = client.completions.create(model=tiny_model, prompt=text, max_tokens=24, temperature=0, logit_bias=bias,
                                      extra_body={"speculative": False})
    assert "speculation" not in plain.usage.model_dump() and plain.choices[0].text == done.choices[0].text
    bad = spec_server.post("/v1/completions", timeout=30,
                     json={"model": tiny_model, "prompt": "x", "speculative": "no"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "speculative"
    stats = spec_server.get("/stats", timeout=30).json()["speculation"]
    assert stats["kind"] == "ngram" and stats["rows"] >= 2 and stats["target_calls"] >= 2
