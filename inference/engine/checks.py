"""What the engine can run: every sampling and logits field checked against
the model before a request reaches a decode step.

A value mlx-lm's samplers or processors cannot take (NaN, a top_k at or
above the vocabulary, an XTC threshold over 0.5, a seed outside 64 bits, a
bias of -inf on every token) would raise inside the batched step, where it
ends every row of the batch, not just its own. `check` refuses it with
`InvalidRequest` naming the field; the protocol modules call it while
reading a request (so the client gets its protocol's 400), and
`Engine.submit` calls it again for requests built elsewhere.

Windows larger than the context (`*_context_size`) mean the whole history,
so they are clamped to the context window instead of refused.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from inference.engine.errors import InvalidRequest
from inference.engine.types import GenerationRequest, HlgParams

MAX_SEED = 2**64 - 1
MAX_BIAS = 100.0  # OpenAI's logit_bias range
MAX_PENALTY = 100.0
MAX_TEMPERATURE = 2.0
MAX_XTC_THRESHOLD = 0.5  # mlx-lm's XTC refuses more
MAX_TOP_LOGPROBS = 11  # mlx-lm's cap
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 1024  # each is matched against every decoded piece on the engine thread
MAX_WINDOW = 2**31 - 1  # a penalty window beyond this overflows MLX's int32 indexing
MAX_HLG_SPAN = 64.0  # logits; the widths of the HLG curve (further than any token of a real model lies)
HLG_SPANS = ("width", "shoulder", "toe", "pivot_offset")


def finite(name: str, value: float, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number, got {value!r}", name)
    if not lo <= value <= hi:
        raise InvalidRequest(f"{name} must be between {lo:g} and {hi:g}, got {value:g}", name)


def integer(name: str, value: int, lo: int, hi: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer, got {value!r}", name)
    if not lo <= value <= hi:
        raise InvalidRequest(f"{name} must be between {lo} and {hi}{hint}, got {value}", name)


def check_hlg(hlg: HlgParams, prefix: str = "hlg.") -> None:
    """Each HLG span a finite number of logits between 0 and MAX_HLG_SPAN,
    named as the request writes it (`hlg.width`)."""
    if not isinstance(hlg.enabled, bool):
        raise InvalidRequest(f"{prefix}enabled must be a boolean, got {hlg.enabled!r}", f"{prefix}enabled")
    for name in HLG_SPANS:
        finite(prefix + name, getattr(hlg, name), 0.0, MAX_HLG_SPAN)


def check(req: GenerationRequest, vocab_size: int, context_window: int | None) -> GenerationRequest:
    """Raise `InvalidRequest` for the first field the engine cannot run;
    return the request with its penalty windows clamped to the context."""
    s = req.sampling
    finite("temperature", s.temperature, 0.0, MAX_TEMPERATURE)
    finite("top_p", s.top_p, 0.0, 1.0)
    finite("min_p", s.min_p, 0.0, 1.0)
    finite("xtc_probability", s.xtc_probability, 0.0, 1.0)
    finite("xtc_threshold", s.xtc_threshold, 0.0, MAX_XTC_THRESHOLD)
    integer("top_k", s.top_k, 0, vocab_size - 1, f" (this model's vocabulary has {vocab_size} tokens; 0 turns it off)")
    if s.seed is not None:
        integer("seed", s.seed, 0, MAX_SEED)
    lp = req.logits
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = getattr(lp, name)
        if value is not None:
            finite(name, value, 0.0 if name == "repetition_penalty" else -MAX_PENALTY, MAX_PENALTY)
    windows: dict[str, Any] = {}  # the *_context_size fields to clamp, passed to replace() by name
    for name in ("repetition_context_size", "presence_context_size", "frequency_context_size"):
        value = getattr(lp, name)
        integer(name, value, 0, MAX_WINDOW)
        if context_window and value > context_window:
            windows[name] = context_window
    if lp.hlg is not None:
        check_hlg(lp.hlg)
    if lp.logit_bias:
        for token, bias in lp.logit_bias.items():
            integer("logit_bias", token, 0, vocab_size - 1, " (a token id of this model's vocabulary)")
            finite("logit_bias", bias, -MAX_BIAS, MAX_BIAS)
    if req.max_tokens is not None:
        integer("max_tokens", req.max_tokens, 1, 2**63 - 1)
    integer("top_logprobs", req.top_logprobs, 0, min(MAX_TOP_LOGPROBS, vocab_size))
    if len(req.stop) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"stop takes at most {MAX_STOP_SEQUENCES} sequences", "stop")
    for text in req.stop:
        if not isinstance(text, str) or len(text) > MAX_STOP_CHARS:
            raise InvalidRequest(f"each stop sequence must be a string of at most {MAX_STOP_CHARS} characters",
                                 "stop")
    if windows:
        req.logits = replace(lp, **windows)
    return req
