"""Parsers of option values shared by `hearth serve`'s flags and the router's
preset files: each takes the text as written and returns the value, or
raises `ValueError` with a message that says what is expected. argparse
shows that message for a flag (it reports `ArgumentTypeError`, a
`ValueError`'s sibling, so `flag()` wraps them); a preset shows it with
the file and line."""
from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable

from core import limits


def non_negative(kind, most: float | None = None) -> Callable[[str], float]:
    def parse(text):
        value = kind(text)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"must be a number of at least 0, got {text}")
        if most is not None and value > most:
            raise ValueError(f"must be at most {most:g}, got {text}")
        return value
    return parse


def names(text: str) -> tuple[str, ...]:
    """One or more names separated by commas (aliases, tags), each once, in order."""
    found = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not found:
        raise ValueError(f"expected one or more names separated by commas, got {text!r}")
    return found


def seconds(text):
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a number of seconds above 0, got {text}")
    return value


def byte_count(text):
    """A byte count: `1073741824`, `512MiB`, `2G`, `1.5GB` (powers of 1024)."""
    return limits.parse_size(text)


def positive(text):
    value = int(text)
    if value < 1:
        raise ValueError(f"must be at least 1, got {text}")
    return value


def _checked(kind: type, expected: str, parse: Callable[[str], object]) -> Callable[[str], object]:
    """`parse` behind a check that the text is a `kind` at all, whose message reads better than
    int()'s `invalid literal for int() with base 10`."""
    def checked(text: str) -> object:
        try:
            kind(text)
        except ValueError:
            raise ValueError(f"expected {expected}, got {text!r}") from None
        return parse(text)
    checked.__name__ = getattr(parse, "__name__", "value")
    return checked


whole = functools.partial(_checked, int, "a whole number")  # whole(parse): an int's text, then `parse`
number = functools.partial(_checked, float, "a number")  # number(parse): a float's text, then `parse`


def choice(*names: str) -> Callable:
    """One of `names`, as written."""
    def parse(text):
        if text not in names:
            raise ValueError(f"expected one of {', '.join(names)}, got {text!r}")
        return text
    parse.__name__ = "choice"
    return parse


def rows(text):
    """`auto` (None: as many as the load asks and memory allows) or a positive count."""
    if text.strip().lower() == "auto":
        return None
    try:
        int(text)
    except ValueError:
        raise ValueError(f"expected auto or a whole number of rows, got {text!r}") from None
    return positive(text)


def unit(text):
    value = float(text)
    if not 0 <= value <= 1:  # NaN fails this too
        raise ValueError(f"must be between 0 and 1, got {text}")
    return value


def boolean(text):
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, got {text}")


def flag(parse: Callable) -> Callable:
    """`parse` as an argparse `type=`: its message shown for a bad value."""
    def typed(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc) or f"invalid value {text!r}") from None
    typed.__name__ = getattr(parse, "__name__", "value")
    return typed
