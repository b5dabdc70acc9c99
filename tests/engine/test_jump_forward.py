"""Jump-forward decoding (inference/engine/speculate.py) in-process on the
tiny model: a lone request under a grammar appends the text the grammar
forces without sampling it, still gives output the grammar accepts, and
counts it in `usage.fill`; a seeded, batched or switched-off request decodes
token by token, and the forced tokens carry logprobs like any other."""
from __future__ import annotations

import asyncio
import json

from inference.engine.grammar import GrammarSpec
from inference.engine.types import GenerationRequest, LogitsParams, SamplingParams
from tests.helpers import collect

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "colour", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "maximum": 120},
                         "colour": {"enum": ["crimson", "turquoise"]},
                         "tags": {"type": "array", "items": {"enum": ["alpha", "beta"]}, "maxItems": 2}}}
PROMPT = [5, 17, 23, 42, 8]


def _request(engine, eos_id, spec: GrammarSpec, **kw) -> GenerationRequest:
    compiler = engine.loaded.grammar_compiler
    kw.setdefault("max_tokens", 160)
    return GenerationRequest(list(PROMPT), grammar=compiler.state(compiler.compile(spec)),
                             logits=LogitsParams(logit_bias={eos_id: -100.0}), **kw)


def _schema() -> GrammarSpec:
    return GrammarSpec("json_schema", json.dumps(SCHEMA))


def test_forced_text_is_appended_and_the_output_follows_the_grammar(engines, eos_id):
    engine = engines(prompt_cache_bytes=0)
    out = asyncio.run(collect(engine, _request(engine, eos_id, _schema())))
    fill = out["usage"].fill
    assert out["finish"] == "stop", out
    value = json.loads(out["text"], strict=False)
    assert set(value) == set(SCHEMA["required"]) and value["colour"] in ("crimson", "turquoise")
    assert out["text"].startswith('{"name": "')  # forced: the object's first key, as the grammar lays it out
    # Every key is forced, and the rest of each enum value after its first letters.
    assert fill["injected"] >= 12 and fill["events"] == len(fill["spanLens"]) and sum(fill["spanLens"]) == \
        fill["injected"] == fill["strict"]
    # Each forward samples one token but the last: once the grammar leaves only a stop token, the row ends
    # without sampling it, as a batch's row does (the same request's usage alone and batched).
    assert out["usage"].completion_tokens == len(out["tokens"]) == fill["injected"] + fill["decodeSteps"]
    stats = engine.spec_totals
    assert stats.fill_rows >= 1 and stats.injected >= fill["injected"]


def test_a_choice_is_forced_once_it_is_decided(engines, eos_id):
    engine = engines(prompt_cache_bytes=0)
    spec = GrammarSpec("choice", json.dumps(["the quick brown fox jumps over the lazy dog"]))
    out = asyncio.run(collect(engine, _request(engine, eos_id, spec, logprobs=True, top_logprobs=2)))
    assert out["text"] == "the quick brown fox jumps over the lazy dog"
    fill = out["usage"].fill
    # All of it forced at once: one forward, after which the grammar leaves only a stop token: none sampled.
    assert fill == {"events": 1, "injected": len(out["tokens"]), "strict": len(out["tokens"]),
                    "spanLens": [len(out["tokens"])], "decodeSteps": 0}
    assert out["usage"].completion_tokens == len(out["tokens"]) and out["finish"] == "stop"
    entries = out["logprobs"]  # the forced tokens' too: the model's logprob of what was appended
    assert len(entries) == len(out["tokens"]) and all(e["logprob"] <= 0 and len(e["top_logprobs"]) == 2
                                                      for e in entries)


def test_seeded_batched_and_switched_off_requests_decode_token_by_token(engines, eos_id):
    engine = engines(prompt_cache_bytes=0)
    seeded = asyncio.run(collect(engine, _request(engine, eos_id, _schema(),
                                                  sampling=SamplingParams(temperature=0.7, seed=3))))
    assert seeded["usage"].fill is None and json.loads(seeded["text"], strict=False)
    off = engines(prompt_cache_bytes=0, jump_forward=False)
    plain = asyncio.run(collect(off, _request(off, eos_id, _schema())))
    assert plain["usage"].fill is None and set(json.loads(plain["text"], strict=False)) == set(SCHEMA["required"])

    async def together():
        return await asyncio.gather(*(collect(engine, _request(engine, eos_id, _schema())) for _ in range(3)))
    outs = asyncio.run(together())
    assert all(set(json.loads(o["text"], strict=False)) == set(SCHEMA["required"]) for o in outs)
    assert any(o["usage"].fill is None for o in outs)  # the ones that ran in the batch decoded plainly
    # Alone or batched, a row ends once the grammar leaves only a stop token, which it does not sample.
    assert all(o["usage"].completion_tokens == len(o["tokens"]) for o in [*outs, plain])


def test_a_mostly_free_grammar_stops_jumping_after_a_trial(engines, eos_id):
    """A regex over letters forces nothing: after 16 sampled tokens the row goes on in plain pipelined
    steps (faster than jump-forward's), still alone and still under its grammar."""
    from inference.engine.speculate import JUMP_TRIAL

    engine = engines(prompt_cache_bytes=0)
    out = asyncio.run(collect(engine, _request(engine, eos_id, GrammarSpec("regex", "[a-z ]{1,200}"),
                                               max_tokens=60)))
    assert out["usage"].lane == "serial" and out["usage"].fill["decodeSteps"] == JUMP_TRIAL
    assert out["usage"].fill["injected"] == 0 and len(out["tokens"]) == 60
    assert set(out["text"]) <= set("abcdefghijklmnopqrstuvwxyz ")
    schema = asyncio.run(collect(engine, _request(engine, eos_id, _schema())))
    assert schema["usage"].lane == "serial"  # a schema's keys keep it appending: it stays
