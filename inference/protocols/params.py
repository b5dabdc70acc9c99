"""Reading and checking the request fields that chat and text completions
share. Each check names the field it rejects; values the body omits fall
back to the server's flags, then the model's generation_config.json."""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

from core import jsonbody
from inference.engine import checks
from inference.engine.adapters import AdapterError, parse_spec
from inference.engine.errors import InvalidRequest
from inference.engine.types import GenerationRequest, HlgParams, LogitsParams, SamplingParams
from inference.protocols.errors import RequestError
from inference.protocols.options import ServerDefaults

MAX_STOP_SEQUENCES = checks.MAX_STOP_SEQUENCES


@dataclass(frozen=True)
class NumberField:
    """A number a request may set: its wire name, JSON type, the range the
    engine runs (None: no fixed bound; `top_k`'s is the model's vocabulary)
    and what it does. The OpenAPI documents, the chat socket, the dashboard's
    sampling panel (`GET /api/sampling-fields`) and `hearth run`'s `/set`
    read these."""

    name: str
    kind: type[int] | type[float]
    minimum: float | None
    maximum: float | None
    description: str


# Every sampling field a request may set, by the name every surface uses
# (chat, completions, Messages, Responses, the chat socket's set_sampling),
# with the engine's bounds (`inference/engine/checks.py`; a test holds them
# to what `checked` refuses). A new one goes here, in `sampling`/`logits_params`
# below, and in engine/checks.py. The one sampling field that is an object,
# `hlg`, is read by `hlg` below.
FIELDS = (
    NumberField("temperature", float, 0.0, checks.MAX_TEMPERATURE, "0 = greedy"),
    NumberField("top_p", float, 0.0, 1.0, "nucleus sampling (0 or 1 = off)"),
    NumberField("top_k", int, 0, None, "the k likeliest tokens, below the vocabulary size (0 = off)"),
    NumberField("min_p", float, 0.0, 1.0, "drops tokens less likely than this times the likeliest (0 = off)"),
    NumberField("xtc_probability", float, 0.0, 1.0, "XTC: the chance, per token, that likely ones are cut (0 = off)"),
    NumberField("xtc_threshold", float, 0.0, checks.MAX_XTC_THRESHOLD,
                "XTC: a token above this probability is likely; all but the least likely are cut (default 0.1)"),
    NumberField("seed", int, 0, checks.MAX_SEED, "the same seed repeats the output"),
    NumberField("repetition_penalty", float, 0.0, checks.MAX_PENALTY,
                "above 1 makes tokens in the window less likely (1 = off)"),
    NumberField("repetition_context_size", int, 0, checks.MAX_WINDOW,
                "tokens the repetition penalty looks back over (default 20)"),
    NumberField("presence_penalty", float, -checks.MAX_PENALTY, checks.MAX_PENALTY,
                "subtracted from the logit of each token in the window"),
    NumberField("presence_context_size", int, 0, checks.MAX_WINDOW,
                "tokens the presence penalty looks back over (default 20)"),
    NumberField("frequency_penalty", float, -checks.MAX_PENALTY, checks.MAX_PENALTY,
                "subtracted from a token's logit once per time it is in the window"),
    NumberField("frequency_context_size", int, 0, checks.MAX_WINDOW,
                "tokens the frequency penalty looks back over (default 20)"),
)
SAMPLING = tuple(f.name for f in FIELDS)


def parse_json_body(raw: bytes, max_depth: int) -> dict:
    """A request's JSON object, nested at most `max_depth` levels; RequestError says why not."""
    try:
        return jsonbody.load_object(raw or b"", max_depth)
    except jsonbody.JsonRefused as exc:
        raise RequestError(str(exc)) from None


LARGE_BODY = 256 << 10  # bodies this large are parsed off the event loop


async def read_json_body(raw: bytes, max_depth: int) -> dict:
    """`parse_json_body`, off the event loop for a large body."""
    if len(raw or b"") > LARGE_BODY:
        return await asyncio.to_thread(parse_json_body, raw, max_depth)
    return parse_json_body(raw, max_depth)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_finite(value: int | float) -> bool:
    """False for NaN, the infinities and integers beyond a float's range."""
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer too large to convert to float
        return False


def number(body: dict, name: str, lo: float | None = None, hi: float | None = None) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value):
        raise RequestError(f"{name} must be a number", name)
    if not _is_finite(value):  # 1e999 parses as inf
        raise RequestError(f"{name} must be a finite number", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise RequestError(f"{name} must be {bounds}, got {value}", name)
    return float(value)


def integer(body: dict, name: str, lo: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise RequestError(f"{name} must be an integer", name)
    if lo is not None and value < lo:
        raise RequestError(f"{name} must be at least {lo}, got {value}", name)
    return value


def boolean(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be a boolean", name)
    return value


def max_tokens(body: dict, defaults: ServerDefaults) -> int | None:
    """`max_completion_tokens` wins over `max_tokens`; unset falls back to
    the server's --max-tokens, then to no cap."""
    explicit = integer(body, "max_completion_tokens", 1)
    if explicit is None:
        explicit = integer(body, "max_tokens", 1)
    return explicit if explicit is not None else defaults.max_tokens


def stop_sequences(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise RequestError("stop must be a string or a list of strings", "stop")
    if len(value) > MAX_STOP_SEQUENCES:
        raise RequestError(f"stop takes at most {MAX_STOP_SEQUENCES} sequences", "stop")
    return [s for s in value if s]


def logit_bias(body: dict, vocab_size: int) -> dict[int, float] | None:
    value = body.get("logit_bias")
    if value is None:
        return None
    try:
        if not isinstance(value, dict) or not all(_is_number(v) for v in value.values()):
            raise TypeError
        bias = {int(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError, OverflowError):
        raise RequestError("logit_bias must be a dict of int to float", "logit_bias") from None
    outside = [k for k in bias if not 0 <= k < vocab_size]
    if outside:
        raise RequestError(f"logit_bias token id {outside[0]} is outside the vocabulary (0..{vocab_size - 1})",
                           "logit_bias")
    return bias


def _model_default(generation_config: dict, name: str):
    """A sampling default from generation_config.json; one the engine could
    not run (NaN, negative) is ignored rather than failing every request."""
    if name == "temperature" and generation_config.get("do_sample") is False:
        return 0.0
    value = generation_config.get(name)
    if not _is_number(value) or not _is_finite(value) or value < 0:
        return None
    if name == "temperature":
        return min(value, checks.MAX_TEMPERATURE)
    if name == "top_p":
        return min(value, 1.0)
    return int(value) if name == "top_k" else value


def gen_defaults(defaults: ServerDefaults, generation_config: dict) -> dict:
    """Sampling defaults as served: the server's flags over the model's own."""
    out = {}
    for name in ("temperature", "top_p", "top_k"):
        flag = getattr(defaults, name)
        out[name] = flag if flag is not None else _model_default(generation_config, name)
    return out


def sampling(body: dict, defaults: ServerDefaults, generation_config: dict, vocab_size: int) -> SamplingParams:
    base = gen_defaults(defaults, generation_config)
    if base.get("top_k") is not None and base["top_k"] >= vocab_size:
        base["top_k"] = 0  # a default top_k over the whole vocabulary keeps every token anyway

    def pick(value, name, fallback):
        if value is not None:
            return value
        return base.get(name) if base.get(name) is not None else fallback

    # Types here; ranges (against this model's vocabulary too) in `checked`.
    temperature = number(body, "temperature")
    top_p = number(body, "top_p")
    top_k = integer(body, "top_k")
    min_p = number(body, "min_p")
    xtc_probability = number(body, "xtc_probability")
    xtc_threshold = number(body, "xtc_threshold")
    seed = integer(body, "seed")
    return SamplingParams(
        temperature=float(pick(temperature, "temperature", 0.0)),
        top_p=float(pick(top_p, "top_p", 0.0)),
        top_k=int(pick(top_k, "top_k", 0)),
        min_p=min_p or 0.0,
        xtc_probability=xtc_probability or 0.0,
        xtc_threshold=0.1 if xtc_threshold is None else xtc_threshold,
        seed=seed,
    )


def checked(request: GenerationRequest, vocab_size: int, context_window: int | None) -> GenerationRequest:
    """The engine's own check of what it can run, as this protocol's 400."""
    try:
        return checks.check(request, vocab_size, context_window)
    except InvalidRequest as exc:
        raise RequestError(str(exc), exc.param) from None


HLG_FIELDS = ("enabled", *checks.HLG_SPANS)


def hlg(body: dict, defaults: ServerDefaults) -> HlgParams | None:
    """The request's `hlg` object merged over the server's --hlg-sampling
    defaults (field by field; the built-in values fill what neither sets).
    Sent at all, it turns the curve on unless the merged `enabled` is false;
    absent, the server's defaults apply as they are. None: no curve."""
    value = body.get("hlg")
    base = defaults.hlg
    if value is None:
        return base if base is not None and base.enabled else None
    if not isinstance(value, dict):
        raise RequestError("hlg must be an object: {enabled, width, shoulder, toe, pivot_offset}", "hlg")
    given: dict[str, Any] = {}
    for key, field_value in value.items():
        name = f"hlg.{key}"
        if key not in HLG_FIELDS:
            raise RequestError(f"{name} is not an hlg field (they are {', '.join(HLG_FIELDS)})", name)
        if field_value is None:
            continue
        if key == "enabled":
            if not isinstance(field_value, bool):
                raise RequestError(f"{name} must be a boolean", name)
        elif not _is_number(field_value) or not _is_finite(field_value):
            raise RequestError(f"{name} must be a finite number", name)
        given[key] = field_value if key == "enabled" else float(field_value)
    merged = replace(base or HlgParams(), **given)
    return merged if merged.enabled else None


def logits_params(body: dict, vocab_size: int, defaults: ServerDefaults) -> LogitsParams:
    def window(name: str) -> int:
        value = integer(body, name)
        return 20 if value is None else value

    return LogitsParams(
        hlg=hlg(body, defaults),
        logit_bias=logit_bias(body, vocab_size),
        repetition_penalty=number(body, "repetition_penalty"),
        repetition_context_size=window("repetition_context_size"),
        presence_penalty=number(body, "presence_penalty"),
        presence_context_size=window("presence_context_size"),
        frequency_penalty=number(body, "frequency_penalty"),
        frequency_context_size=window("frequency_context_size"),
    )


MAX_TOP_LOGPROBS = checks.MAX_TOP_LOGPROBS  # mlx-lm's cap, not OpenAI's 20


def logprobs(body: dict, completion: bool = False) -> tuple[bool, int]:
    """(logprobs, top_logprobs) with mlx_lm.server's exact validation; a
    completion's `logprobs` may also be the legacy count of top tokens."""
    want = body.get("logprobs", False)
    if want is None:
        want = False
    if completion and isinstance(want, int) and not isinstance(want, bool):
        if not 0 <= want <= MAX_TOP_LOGPROBS:
            raise RequestError(f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}", "logprobs")
        return True, want
    if not isinstance(want, bool):
        raise RequestError("logprobs must be of type bool", "logprobs")
    top = body.get("top_logprobs", -1)
    if top is None:
        top = -1
    if not isinstance(top, int) or isinstance(top, bool):
        raise RequestError("top_logprobs must be of type int", "top_logprobs")
    if top != -1 and top < 0:
        raise RequestError("top_logprobs must be at least 0", "top_logprobs")
    if top > MAX_TOP_LOGPROBS:
        raise RequestError(f"top_logprobs must be at most {MAX_TOP_LOGPROBS}", "top_logprobs")
    return want, max(top, 0)


MAX_CHOICES = 8  # `n`: each choice is a row of the batch


def choices(body: dict) -> int:
    """`n`, the number of choices (1 when absent)."""
    n = integer(body, "n", 1)
    if n is not None and n > MAX_CHOICES:
        raise RequestError(f"n may be at most {MAX_CHOICES} on this server (each choice is a row of the batch)", "n")
    return n or 1


MAX_SESSION_KEY = 256


def session_key(body: dict, headers) -> str | None:
    """The prompt-cache session a request belongs to: body `session_id`,
    then body `prompt_cache_key`, then the `x-session-affinity` header, then
    a `session_id` header. A label only steers cache lookup; it grants nothing."""
    for name in ("session_id", "prompt_cache_key"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not value or len(value) > MAX_SESSION_KEY:
            raise RequestError(f"{name} must be a non-empty string of at most {MAX_SESSION_KEY} characters", name)
        return value
    for name in ("x-session-affinity", "session-id"):  # "session-id" also finds a `session_id` header
        value = headers.get(name)
        if value:
            return value[:MAX_SESSION_KEY]
    return None


def adapter(body: dict, mounted) -> tuple[str, ...] | None:
    """The `adapter` extra: None (absent: the server's default adapter),
    () for the base model ("none"), or mounted adapter ids ("a+b" stacks
    them). `mounted` is the model's AdapterManager."""
    try:
        spec = parse_spec(body.get("adapter"))
        mounted.check(spec)
    except AdapterError as exc:
        raise RequestError(str(exc), "adapter") from None
    return spec
