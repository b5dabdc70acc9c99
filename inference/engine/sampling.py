"""Per-request samplers, logits processors and logprob entries.

Each request gets its own sampler so that rows of one batch can differ in
temperature, top-p/top-k/min-p and XTC. A request with a `seed` draws from
its own key (split once per token), so its output does not depend on the
other rows in the batch or on the order requests arrived in.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import cast

from inference.engine.hlg import HlgProcessor
from inference.engine.types import GenerationRequest


def make_sampler(req: GenerationRequest, special_ids: list[int]):
    """mlx-lm's sampler chain for this request; keyed when it has a seed."""
    from mlx_lm.sample_utils import make_sampler as mlx_sampler

    s = req.sampling
    if s.seed is None or s.temperature == 0:
        return mlx_sampler(s.temperature, s.top_p, s.min_p, 1, top_k=s.top_k,
                           xtc_probability=s.xtc_probability, xtc_threshold=s.xtc_threshold,
                           xtc_special_tokens=special_ids)
    return _SeededSampler(req, special_ids, s.seed)


@functools.cache
def _argmax():
    from mlx_lm.sample_utils import greedy_sampler

    return greedy_sampler


def greedy(sampler) -> bool:
    """Whether `sampler` is mlx-lm's argmax, every temperature-0 request's (asked per row per step)."""
    return sampler is _argmax()


def sample(sampler, logits, logprobs):
    """A token from `sampler`: a greedy one takes the argmax of the logits as they are, so a greedy row
    picks the same token whether or not its step computed the log-softmax (for logprobs, or for a
    sampled row beside it), where rounding could otherwise tie two near-equal logits."""
    return sampler(logits) if greedy(sampler) else sampler(logprobs)


class _SeededSampler:
    """The same chain as `mlx_lm.sample_utils.make_sampler`, drawing every
    random number from a key owned by the request."""

    def __init__(self, req: GenerationRequest, special_ids: list[int], seed: int):
        import mlx.core as mx

        self.s = req.sampling
        self.seed = seed
        self.special = special_ids
        self.key = mx.random.key(seed)

    def rewind(self, draws: int) -> None:
        """Back to the key after `draws` tokens, so a row restarted from its
        n generated tokens draws the n+1th as it would have."""
        import mlx.core as mx

        self.key = mx.random.key(self.seed)
        for _ in range(draws * (2 if self.s.xtc_probability > 0.0 else 1)):  # XTC splits once more
            self.key, _ = mx.random.split(self.key)

    def _next_key(self):
        import mlx.core as mx

        self.key, sub = mx.random.split(self.key)
        return sub

    def __call__(self, logprobs):
        import mlx.core as mx
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        s = self.s
        if 0 < s.top_p < 1.0:
            logprobs = apply_top_p(logprobs, s.top_p)
        if s.min_p != 0.0:
            logprobs = apply_min_p(logprobs, s.min_p, 1)
        if s.xtc_probability > 0.0:
            logprobs = self._xtc(logprobs)
        if s.top_k > 0:
            logprobs = apply_top_k(logprobs, s.top_k)
        return mx.random.categorical(logprobs * (1.0 / s.temperature), key=self._next_key())

    def _xtc(self, logits):
        import mlx.core as mx

        probs = mx.softmax(logits, -1)
        mask = probs > mx.where(probs > self.s.xtc_threshold, probs, mx.inf).min(axis=-1, keepdims=True)
        if self.special:
            mask[..., self.special] = False
        skip = mx.random.uniform(0, 1, key=self._next_key()) > self.s.xtc_probability
        return mx.where(skip, logits, mx.where(mask, -mx.inf, logits))


class LogitBias:
    """mlx-lm's logit-bias processor, as an object the batch step can recognise and apply to every row
    at once (`lanes`' lean step)."""

    def __init__(self, bias: dict[int, float]):
        import mlx.core as mx

        self.ids = mx.array(list(bias.keys()))
        self.values = mx.array(list(bias.values()))

    def __call__(self, _tokens, logits):
        return logits.at[:, self.ids].add(self.values)


class Penalty:
    """One of mlx-lm's repetition, presence and frequency penalties over the
    last `window` tokens of a row's context (0: all of it), as an object the
    batch step can recognise and apply to many rows at once (`lanes`' lean
    step). A row alone runs mlx-lm's own processor."""

    KINDS = ("repetition", "presence", "frequency")  # mlx-lm's order

    def __init__(self, kind: str, value: float, window: int):
        from mlx_lm import sample_utils

        self.kind, self.value, self.window = kind, value, window
        self._own = getattr(sample_utils, f"make_{kind}_penalty")(value, window)

    def __call__(self, tokens, logits):
        return self._own(tokens, logits)


def make_processors(req: GenerationRequest) -> list:
    """Bias and penalties in mlx-lm's order, then the grammar mask, then the
    HLG tone curve: it is measured from the top logit, which must be a token
    the bias, penalties and grammar leave standing; then the think bound."""
    lp = req.logits
    processors: list = [LogitBias(lp.logit_bias)] if lp.logit_bias else []
    for kind in Penalty.KINDS:  # as mlx-lm's make_logits_processors: a penalty of 0 is none
        value = getattr(lp, f"{kind}_penalty")
        if value is not None and value != 0:
            processors.append(Penalty(kind, value, getattr(lp, f"{kind}_context_size")))
    if req.grammar is not None:
        processors.append(req.grammar)
    if lp.hlg is not None and lp.hlg.enabled:
        processors.append(HlgProcessor(lp.hlg))
    if req.think is not None:  # last: a forced closing token overrides every other preference
        processors.append(req.think)
    return processors


@dataclass
class TokenLogprobs:
    """A sampled token's logprob and the most likely tokens of its step (at
    least as many as its row asked for, most likely first), read from the
    device for all the rows of a batched step at once (`top_logprobs`)."""

    logprob: float
    top: list[tuple[int, float]]


def top_logprobs(logprobs, tokens, k: int):
    """For each row of `logprobs` (rows x vocabulary), the logprob of its token in
    `tokens` and its `k` most likely tokens' ids and logprobs, most likely first:
    lazy arrays ((rows,), (rows, k), (rows, k)), what `logprob_entry` computes
    for one row, for the batch in a few operations."""
    import mlx.core as mx

    chosen = mx.take_along_axis(logprobs, tokens.astype(mx.int32)[:, None], axis=-1)[:, 0]
    if k == 0:
        return chosen, mx.zeros((chosen.size, 0), dtype=mx.int32), mx.zeros((chosen.size, 0), dtype=logprobs.dtype)
    best = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
    scores = mx.take_along_axis(logprobs, best, axis=-1)
    order = mx.argsort(-scores, axis=-1)
    return chosen, mx.take_along_axis(best, order, axis=-1), mx.take_along_axis(scores, order, axis=-1)


def logprob_entry(tokenizer, token: int, logprobs, top: int) -> dict:
    """OpenAI's logprobs entry for the chosen token: its text, its UTF-8 bytes,
    its logprob, and the `top` most likely tokens in the same form, most
    likely first (an empty list when none were asked for). `id` is Hearth's
    own: the token id, beside each text. `logprobs` is the step's
    log-probabilities for this row, or a `TokenLogprobs` already read."""
    import mlx.core as mx

    if not isinstance(logprobs, TokenLogprobs):  # one row's: the batched computation on a batch of one
        values = top_logprobs(logprobs.reshape(1, -1), mx.array([token]), top)
        mx.eval(*values)
        chosen, ids, scores = (cast("list", a.tolist())[0] for a in values)
        logprobs = TokenLogprobs(chosen, list(zip(ids, scores, strict=True)))
    return {**_token(tokenizer, token, logprobs.logprob),
            "top_logprobs": [_token(tokenizer, i, v) for i, v in logprobs.top[:top]]}


def _token(tokenizer, token: int, logprob: float) -> dict:
    raw = token_bytes(tokenizer, token)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # part of a character: OpenAI writes the bytes out
        text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    return {"id": token, "token": text, "logprob": logprob, "bytes": list(raw)}


def token_bytes(tokenizer, token: int) -> bytes:
    """The bytes a token stands for in the text. The detokenizer mlx-lm picked
    for the tokenizer holds each token's piece: a SentencePiece piece as bytes
    (its byte tokens already turned into their byte, `▁` still the word
    marker), a byte-level BPE piece in GPT-2's byte alphabet. Decoding the
    token alone would give a lone U+FFFD for part of a character, and the
    tokenizer's clean-ups could drop a leading space."""
    from mlx_lm.tokenizer_utils import _byte_decoder  # GPT-2's alphabet; mlx-lm keeps the one table

    pieces = getattr(getattr(tokenizer, "_detokenizer", None), "tokenmap", None)
    if pieces is None or not 0 <= token < len(pieces):
        return tokenizer.decode([token]).encode()
    piece = pieces[token]
    if not piece:  # a gap in the vocabulary
        return tokenizer.decode([token]).encode()
    if isinstance(piece, bytes):
        return piece.replace("\u2581".encode(), b" ")
    alphabet = _byte_decoder()
    if all(c in alphabet for c in piece):
        return bytes(alphabet[c] for c in piece)
    return piece.encode()
