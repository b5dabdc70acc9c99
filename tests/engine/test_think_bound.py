"""The think bound (inference/engine/think.py) on an in-process engine: a
row inside a think block writes `budget` tokens, then exactly the closing
tokens, then goes on; a budget of 0 closes at once; a block the model opens
itself is bounded from its opening; one the model closes itself is left
alone; a closing token the grammar forbids is never forced; a row moved to
a fresh lane carries on from what it had generated."""
from __future__ import annotations

import asyncio

import pytest

from tests.helpers import collect

CLOSE = (11, 12, 13)  # any tokens stand for `</think>` here
OPEN = 21  # and one for `<think>`
PIECES = {11: "</", 12: "think", 13: ">", OPEN: "<think>"}


def piece(token: int) -> str:
    return PIECES.get(token, "·")


def _request(eos_id: int, budget: int, inside: bool = True, max_tokens: int = 12):
    from inference.engine.think import ThinkBound
    from inference.engine.types import GenerationRequest, LogitsParams

    return GenerationRequest([1, 2, 3, 4], max_tokens=max_tokens, logits=LogitsParams(logit_bias={eos_id: -100}),
                             think=ThinkBound(budget, CLOSE, piece, inside=inside))


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("budget", [0, 3])
def test_the_block_closes_after_its_budget_and_generation_goes_on(engines, eos_id, batch, budget):
    engine = engines(batch=batch, prompt_cache_bytes=0)
    tokens = asyncio.run(collect(engine, _request(eos_id, budget)))["tokens"]
    assert len(tokens) == 12 and tuple(tokens[budget:budget + 3]) == CLOSE, tokens


def test_a_block_the_model_opens_is_bounded_from_its_opening(engines, eos_id):
    from inference.engine.types import LogitsParams

    engine = engines(batch=8, prompt_cache_bytes=0)
    request = _request(eos_id, 2, inside=False, max_tokens=10)
    request.logits = LogitsParams(logit_bias={eos_id: -100, OPEN: 100})  # it opens the block, and again
    tokens = asyncio.run(collect(engine, request))["tokens"]
    assert tokens[:3] == [OPEN] * 3 and tuple(tokens[3:6]) == CLOSE and tokens[6:] == [OPEN] * 4, tokens


def test_without_a_block_nothing_is_forced(engines, eos_id):
    engine = engines(batch=8, prompt_cache_bytes=0)
    tokens = asyncio.run(collect(engine, _request(eos_id, 0, inside=False)))["tokens"]
    assert OPEN not in tokens and tuple(tokens[:3]) != CLOSE


def test_a_block_the_model_closed_itself_is_left_alone_and_a_restart_remembers():
    import mlx.core as mx

    from inference.engine.think import ThinkBound

    logits = mx.zeros((1, 32))
    bound = ThinkBound(5, CLOSE, piece, inside=True)
    bound.restart([5, *CLOSE])  # closed by the model after one token
    assert mx.array_equal(bound(mx.array([1, 5, *CLOSE]), logits), logits)
    assert mx.array_equal(bound(mx.array([1, 5, *CLOSE, 9]), logits), logits)
    bound = ThinkBound(5, CLOSE, lambda t: {31: "</thi", 32: "nk>"}.get(t, "·"), inside=True)
    bound.restart([5, 31, 32])  # closed in another spelling: found in the text
    assert mx.array_equal(bound(mx.array([1, 5, 31, 32]), logits), logits)

    bound = ThinkBound(2, CLOSE, piece, inside=True)
    bound.restart([5, 6])  # two tokens in: the next ones are the closing tokens
    forced = bound(mx.array([1, 5, 6]), logits)  # the fresh lane's first call sees what was generated
    assert int(mx.argmax(forced).item()) == CLOSE[0] and int(mx.isfinite(forced).sum().item()) == 1
    forced = bound(mx.array([1, 5, 6, CLOSE[0]]), logits)
    assert int(mx.argmax(forced).item()) == CLOSE[1]
    bound.restart([5, 6, CLOSE[0]])  # moved again in the middle of the close: it goes on, not over
    assert int(mx.argmax(bound(mx.array([1, 5, 6, CLOSE[0]]), logits)).item()) == CLOSE[1]


def test_a_closing_token_the_grammar_forbids_is_not_forced():
    import mlx.core as mx

    from inference.engine.think import ThinkBound

    masked = mx.where(mx.arange(32) == CLOSE[0], -mx.inf, mx.zeros((1, 32)))  # as a grammar's mask leaves it
    bound = ThinkBound(0, CLOSE, piece, inside=True)
    assert mx.array_equal(bound(mx.array([1]), masked), masked)
    assert mx.array_equal(bound(mx.array([1, 7]), mx.zeros((1, 32))), mx.zeros((1, 32)))  # it stood down
