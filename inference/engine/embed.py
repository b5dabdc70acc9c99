"""Sentence embeddings from a causal model: last-token pooling over the
final (normed) hidden states, L2-normalized. Runs on the engine thread.

`embed_turns` splits the work into turns of the engine thread of at most
about `budget` tokens of forward each, the engine's prefill chunk, so the
decode steps of running generations go on between them: an input longer
than a turn is run through the model in segments over a KV cache (its last
position sees the whole input, as in one forward), short inputs share a
padded batch."""
from __future__ import annotations

from collections.abc import Iterator

CHUNK = 32  # inputs per padded forward


def embed(model, token_lists: list[list[int]]) -> list[list[float]]:
    """One unit vector per token list. Inputs are right-padded into one
    batch per chunk; causal attention keeps each row's last real position
    blind to the padding after it, so no mask is needed."""
    import mlx.core as mx

    out: list[list[float]] = []
    for start in range(0, len(token_lists), CHUNK):
        chunk = token_lists[start:start + CHUNK]
        width = max(len(t) for t in chunk)
        batch = mx.array([t + [0] * (width - len(t)) for t in chunk])
        hidden = model.model(batch)  # [B, L, D] after the final norm
        last = hidden[mx.arange(len(chunk)), mx.array([len(t) - 1 for t in chunk])]
        out += _unit(last).tolist()
    return out


def embed_turns(model, token_lists: list[list[int]], budget: int) -> Iterator[list[list[float]]]:
    """The unit vectors of `token_lists`, in order, over several `next()`
    calls (each on the engine thread), each running at most about `budget`
    tokens (padding included) of forward: the vectors of the inputs it
    finished, or none while a long input is part way."""
    budget = max(1, budget)
    i = 0
    while i < len(token_lists):
        if len(token_lists[i]) > budget:
            yield from _long(model, token_lists[i], budget)
            i += 1
            continue
        group = [token_lists[i]]
        width = len(group[0])
        while i + len(group) < len(token_lists) and len(group) < CHUNK:
            nxt = token_lists[i + len(group)]
            if (len(group) + 1) * max(width, len(nxt)) > budget:
                break
            group.append(nxt)
            width = max(width, len(nxt))
        yield embed(model, group)
        i += len(group)


def _long(model, tokens: list[int], budget: int) -> Iterator[list[list[float]]]:
    """One input run through the model `budget` tokens at a time, its KV cache carried between turns."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    for start in range(0, len(tokens), budget):
        hidden = model.model(mx.array(tokens[start:start + budget])[None], cache=cache)
        if start + budget < len(tokens):
            # MLX is lazy: the segment's work is done in this turn, not deferred to the last one.
            mx.eval([c.state for c in cache])
            yield []
    yield _unit(hidden[:, -1]).tolist()


def _unit(last):
    import mlx.core as mx

    last = last.astype(mx.float32)
    return last / mx.maximum(mx.linalg.norm(last, axis=-1, keepdims=True), 1e-12)
