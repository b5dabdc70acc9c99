"""The Curve Designer's model work (`/signal`, `/generate`), run through
`Engine.exclusive` on the engine thread with the model to itself.

The designer's axis is a token's log-probability x in [X_MIN, 0]. A drawn
curve maps x to a log-weight y, and a token is drawn with probability
proportional to e^y: it replaces temperature and softmax. Between its
points the curve is piecewise linear; left of the first point and right of
the last it goes on with slope 1, so the order of tokens stays as the
points set it. A token whose y is at or below X_MIN is never drawn (drag
the tail to the floor to cut it off), except the most likely token, which
always stays drawable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from inference.engine.sampling import make_sampler
from inference.engine.types import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from inference.engine.loader import LoadedModel

X_MIN, X_MAX = -20.0, 0.0  # the designer's axis, in log-probability (nats)
BINS = 80
PREFILL_CHUNK = 512


@dataclass(frozen=True)
class DrawnCurve:
    """At least two points, x strictly increasing, y never decreasing
    (the protocol module checks them)."""

    points: tuple[tuple[float, float], ...]

    def apply(self, logprobs):
        """Log-weights for `logprobs` (any shape): the sum of clipped ramps,
        y0 + min(x - x0, 0) + sum of slope_i * clip(x - x_i, 0, x_{i+1} - x_i)
        + max(x - x_last, 0), then the floor cut."""
        import mlx.core as mx

        pts = self.points
        x0, y0 = pts[0]
        y = y0 + mx.minimum(logprobs - x0, 0.0) + mx.maximum(logprobs - pts[-1][0], 0.0)
        for (xa, ya), (xb, yb) in zip(pts, pts[1:], strict=False):
            y = y + (yb - ya) / (xb - xa) * mx.clip(logprobs - xa, 0.0, xb - xa)
        top = logprobs >= mx.max(logprobs, axis=-1, keepdims=True)
        return mx.where((y > X_MIN) | top, y, -mx.inf)


class CurveSampler:
    """Draws from e^curve(logprobs) with a key of its own."""

    def __init__(self, curve: DrawnCurve, seed: int):
        import mlx.core as mx

        self.curve = curve
        self.key = mx.random.key(seed)

    def __call__(self, logprobs):
        import mlx.core as mx

        self.key, sub = mx.random.split(self.key)
        return mx.random.categorical(self.curve.apply(logprobs), key=sub)


def prefill_logprobs(model: LoadedModel, tokens: list[int]):
    """The next-token log-probabilities after `tokens`: one forward pass
    over a fresh KV cache, in chunks (the prompt cache is not touched)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model.model)
    logits = None
    for start in range(0, len(tokens), PREFILL_CHUNK):
        logits = model.model(mx.array(tokens[start:start + PREFILL_CHUNK])[None], cache=cache)
        mx.eval(logits)
    assert logits is not None, "an empty prompt"
    last = logits[0, -1].astype(mx.float32)
    return last - mx.logsumexp(last)


def signal(model: LoadedModel, tokens: list[int]) -> dict:
    """The next-token distribution as a histogram over the axis: BINS equal
    buckets from X_MIN to X_MAX, log-probabilities below X_MIN counted in the
    first, so the bins always add up to the vocabulary size."""
    import mlx.core as mx

    logprobs = prefill_logprobs(model, tokens)
    width = (X_MAX - X_MIN) / BINS
    index = mx.clip(mx.floor((logprobs - X_MIN) / width), 0, BINS - 1).astype(mx.int32)
    counts = mx.zeros((BINS,), dtype=mx.int32).at[index].add(1)
    bins = cast("list[int]", counts.tolist())  # of a 1-D int array: a list of ints
    return {"bins": bins, "vocab": int(logprobs.shape[0])}


@dataclass(frozen=True)
class Recipe:
    """The sampler of default mode: what a request naming no sampling field gets."""

    temperature: float
    top_p: float
    top_k: int


def generate(model: LoadedModel, tokens: list[int], n: int, max_tokens: int, seed: int,
             curve: DrawnCurve | None, recipe: Recipe) -> list[list[int]]:
    """`n` samples of at most `max_tokens` tokens after `tokens`, batched;
    sample i draws with seed + i, from the curve or else the recipe. EOS
    ends a sample and is not part of it."""
    from mlx_lm.generate import BatchGenerator

    eos = sorted(model.tokenizer.eos_token_ids)
    special = model.newline_ids + eos
    samplers: list[Any] = []
    for i in range(n):
        if curve is not None:
            samplers.append(CurveSampler(curve, seed + i))
        else:
            params = SamplingParams(temperature=recipe.temperature, top_p=recipe.top_p, top_k=recipe.top_k,
                                    seed=seed + i)
            samplers.append(make_sampler(GenerationRequest([], sampling=params), special))
    gen = BatchGenerator(model.model, stop_tokens=[[t] for t in eos], completion_batch_size=n,
                         prefill_batch_size=n, prefill_step_size=PREFILL_CHUNK)
    try:
        uids = gen.insert([list(tokens)] * n, max_tokens=[max_tokens] * n, samplers=samplers)
        out: dict[int, list[int]] = {uid: [] for uid in uids}
        running = set(uids)
        while running:
            _, responses = gen.next()
            for r in responses:
                if r.uid not in running:
                    continue
                if r.token not in eos:
                    out[r.uid].append(r.token)
                if r.finish_reason is not None:
                    running.discard(r.uid)
    finally:
        gen.close()
    return [out[uid] for uid in uids]
