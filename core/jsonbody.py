"""Strict JSON for request bodies and socket frames: only what RFC 8259
allows (no NaN or Infinity, which Python's parser accepts and which no
sampler can use), nested at most `max_depth` levels, so a hostile document
is a clear refusal instead of a RecursionError deep in a handler. A string
may not hold an unpaired UTF-16 surrogate (`"\\ud800"` parses, but is no
character: it cannot be encoded as UTF-8, tokenized or written to a file).

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import json
import math
import re
from typing import Any

from core.limits import DEFAULT


class JsonRefused(ValueError):
    """The text is not JSON this server takes; the message says why."""


class _Constant(ValueError):
    pass


def _no_constants(name: str):
    raise _Constant(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _Constant(f"{text} is too large for a number")
    return value


_SURROGATE = re.compile(r"[\ud800-\udfff]")
# Where a parsed string can get a surrogate from: an escape (\ud800-\udfff), or in UTF-8 bytes one encoded
# as it is (the parser decodes with "surrogatepass"). A text with neither needs no walk of its strings.
_ESCAPED = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPED_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
_RAW_UTF8 = re.compile(rb"\xed[\xa0-\xbf]")


def depth(value: Any) -> int:
    """How deeply arrays and objects nest in `value` (a scalar is 0)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _may_hold_surrogate(data: bytes | str, utf8: bool) -> bool:
    """False where no string parsed from `data` (UTF-8 bytes when `utf8`) can hold a surrogate (found in C,
    not by a walk)."""
    if isinstance(data, str):
        return bool(_SURROGATE.search(data) or _ESCAPED.search(data))
    return not utf8 or bool(_ESCAPED_BYTES.search(data) or _RAW_UTF8.search(data))


def _may_nest_past(data: bytes | str, max_depth: int, utf8: bool) -> bool:
    """False where `data` has too few brackets to nest past `max_depth` (brackets inside strings count too,
    so this only ever sends a document to the walk it could skip)."""
    if isinstance(data, str):
        return data.count("[") + data.count("{") > max_depth
    return not utf8 or data.count(b"[") + data.count(b"{") > max_depth


def _holds_surrogate(value: Any) -> bool:
    """Whether a string in `value`, a key or a value, holds a lone surrogate
    (an escaped pair such as `"\\ud83d\\ude00"` parses to one character)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def load_object(data: bytes | str, max_depth: int = DEFAULT.max_json_depth, what: str = "JSON body") -> dict:
    """`loads` for a body that must be a JSON object."""
    value = loads(data, max_depth, what)
    if not isinstance(value, dict):
        raise JsonRefused(f"invalid {what}: expected an object")
    return value


def loads(data: bytes | str, max_depth: int = DEFAULT.max_json_depth, what: str = "JSON body") -> Any:
    """The parsed value, or JsonRefused("invalid <what>[: why]")."""
    try:
        value = json.loads(data, parse_constant=_no_constants, parse_float=_finite)
    except RecursionError:
        raise JsonRefused(f"invalid {what}: nested more than {max_depth} levels deep") from None
    except _Constant as exc:
        raise JsonRefused(f"invalid {what}: {exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise JsonRefused(f"invalid {what}") from None
    utf8 = isinstance(data, str) or json.detect_encoding(data) == "utf-8"
    if _may_nest_past(data, max_depth, utf8) and depth(value) > max_depth:
        raise JsonRefused(f"invalid {what}: nested more than {max_depth} levels deep")
    if _may_hold_surrogate(data, utf8) and _holds_surrogate(value):
        raise JsonRefused(f"invalid {what}: a string holds an unpaired surrogate (\\ud800-\\udfff), "
                          "which is not a character")
    return value
