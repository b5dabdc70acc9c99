"""The chat's generation settings beside the sampling fields: `max_tokens`,
`stop`, `logit_bias` (by token id, or by token text turned into ids with
the served model's tokenizer) and `response_format`. Checked when a
`set_sampling` frame sets them, stored with the session's sampling values,
and sent with every turn as the /v1 request fields of the same names."""
from __future__ import annotations

import json

from core import limits
from inference.engine.checks import MAX_STOP_CHARS, MAX_STOP_SEQUENCES
from inference.protocols.params import NumberField

KEYS = ("max_tokens", "stop", "logit_bias", "response_format")
# The one number of these, declared as the sampling fields are (`params.FIELDS`): the
# dashboard's panel draws both from `GET /api/sampling-fields`.
FEWEST_TOKENS, MOST_TOKENS = 1, 1_000_000
MAX_TOKENS = NumberField("max_tokens", int, FEWEST_TOKENS, MOST_TOKENS, "most tokens a reply may have")
MOST_STOPS, MOST_STOP_CHARS = MAX_STOP_SEQUENCES, MAX_STOP_CHARS  # what /v1 takes: the turn sends them there
MOST_BIASES = 300
FORMATS = ("text", "json_object", "json_schema")


def check(key: str, value, tokenizer=None):
    """`value` as stored, or ValueError saying what is wrong. `tokenizer`
    (the served model's, when this process has it) reads bias keys that are
    text rather than token ids."""
    if value is None:
        return None
    return {"max_tokens": _max_tokens, "stop": _stop, "logit_bias": _bias,
            "response_format": _format}[key](value, tokenizer)


def _max_tokens(value, _):
    if isinstance(value, bool) or not isinstance(value, int) or not FEWEST_TOKENS <= value <= MOST_TOKENS:
        raise ValueError(f"max_tokens must be a whole number from {FEWEST_TOKENS} to {MOST_TOKENS}, or null")
    return value


def _stop(value, _):
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and 0 < len(s) <= MOST_STOP_CHARS for s in stops) \
            or len(stops) > MOST_STOPS:
        raise ValueError(f"stop must be up to {MOST_STOPS} non-empty strings of at most {MOST_STOP_CHARS} characters")
    return stops or None


def _bias(value, tokenizer):
    if not isinstance(value, dict) or len(value) > MOST_BIASES:
        raise ValueError(f"logit_bias must map up to {MOST_BIASES} tokens (ids, or text) to numbers")
    out: dict[str, float] = {}
    for key, bias in value.items():
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise ValueError(f"logit_bias[{key!r}] must be a number from -100 to 100")
        for token in _token_ids(key, tokenizer):
            out[str(token)] = float(bias)
    return out


def _token_ids(key: str, tokenizer) -> list[int]:
    if key.strip().isdigit():
        return [int(key)]
    if not key:
        raise ValueError("logit_bias has an empty token text")
    if tokenizer is None:
        raise ValueError(f"logit_bias by text ({key!r}) needs the model's tokenizer, which this process does "
                         "not hold (router mode): give token ids")
    ids = tokenizer.encode(key, add_special_tokens=False)
    if not ids:
        raise ValueError(f"logit_bias: {key!r} is no token")
    return list(ids)  # a text of several tokens biases each of them


def _format(value, _):
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in FORMATS:
        raise ValueError(f"response_format.type must be one of {', '.join(FORMATS)}")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError("response_format.json_schema.schema must be a JSON schema object")
        most = limits.current().max_grammar_bytes
        if len(json.dumps(spec["schema"])) > most:
            raise ValueError(f"the response format's schema is over {most} bytes")
        out = {"name": str(spec.get("name") or "reply")[:64], "schema": spec["schema"],
               "strict": spec.get("strict", True) is True}
        if isinstance(spec.get("any_whitespace"), bool):  # False: compact JSON, no padding between tokens
            out["any_whitespace"] = spec["any_whitespace"]
        return {"type": kind, "json_schema": out}
    return None if kind == "text" else {"type": kind}


def stored(saved: dict) -> dict:
    """The settings of a saved sampling object that still read as valid."""
    out = {}
    for key in KEYS:
        try:
            value = check(key, saved.get(key))
        except ValueError:
            continue
        if value is not None:
            out[key] = value
    return out
