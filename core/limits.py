"""The bounds on what one request may cost, in one place.

Each bound has an environment variable (`ENV`), and `hearth serve` has a
flag for each that it writes back into the environment (`export`), so the
job worker and every child process see the same bounds; `current()` is
what this process runs with. The defaults are what one machine serving a
few users needs. Each bound is checked where the cost would be paid, before
it is paid, and refused in the caller's protocol with a message that names
the bound.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, fields

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    # HTTP, before any view runs
    max_body_bytes: int = 32 * MiB  # larger bodies: 413, refused before they are read
    max_json_depth: int = 64  # arrays and objects nested deeper: 400
    header_timeout_s: float = 30.0  # a request's headers must arrive within this
    body_timeout_s: float = 120.0  # and its body within this once the headers are in
    idle_timeout_s: float = 60.0  # a keep-alive connection with no request is closed
    write_timeout_s: float = 60.0  # a response whose client reads nothing for this long is cut
    # Prompts
    max_messages: int = 4096  # turns in one request (messages, input items)
    max_prompt_chars: int = 2_000_000  # characters of every message, system text and tool schema together
    # Grammars (structured output)
    max_grammar_bytes: int = 64 * 1024  # a schema, grammar or regex, as text
    max_grammar_choices: int = 1024  # guided_choice entries
    max_schema_depth: int = 32  # JSON nesting of a JSON schema
    grammar_timeout_s: float = 10.0  # how long a grammar may take to compile; past it, its process is killed
    grammar_cache_bytes: int = 256 * MiB  # compiled grammars kept for reuse
    # Client chat templates (chat_template_kwargs.chat_template)
    allow_client_templates: bool = False
    template_timeout_s: float = 5.0
    # Media named by URL in a request (core/media.py)
    allow_private_media: bool = False  # fetch from loopback, private and link-local addresses too
    max_media_bytes: int = 64 * MiB  # an image or audio clip, fetched or in a data: URL
    max_video_bytes: int = 256 * MiB  # a video clip
    media_timeout_s: float = 10.0  # one fetch, redirects included
    # Audio (uploads, URLs, chat audio parts, live sessions): decoded no further than this
    max_audio_seconds: float = 1800.0
    # The dashboard socket
    max_socket_text: int = 200_000  # characters of a prompt or system prompt sent over /ws/chat


DEFAULT = Limits()

ENV = {
    "max_body_bytes": "HEARTH_MAX_BODY_BYTES", "max_json_depth": "HEARTH_MAX_JSON_DEPTH",
    "header_timeout_s": "HEARTH_HEADER_TIMEOUT", "body_timeout_s": "HEARTH_BODY_TIMEOUT",
    "idle_timeout_s": "HEARTH_IDLE_TIMEOUT", "write_timeout_s": "HEARTH_WRITE_TIMEOUT",
    "max_messages": "HEARTH_MAX_MESSAGES",
    "max_prompt_chars": "HEARTH_MAX_PROMPT_CHARS", "max_grammar_bytes": "HEARTH_MAX_GRAMMAR_BYTES",
    "max_grammar_choices": "HEARTH_MAX_GRAMMAR_CHOICES", "max_schema_depth": "HEARTH_MAX_SCHEMA_DEPTH",
    "grammar_timeout_s": "HEARTH_GRAMMAR_TIMEOUT", "grammar_cache_bytes": "HEARTH_GRAMMAR_CACHE_BYTES",
    "allow_client_templates": "HEARTH_ALLOW_CLIENT_TEMPLATES", "template_timeout_s": "HEARTH_TEMPLATE_TIMEOUT",
    "max_socket_text": "HEARTH_MAX_SOCKET_TEXT", "allow_private_media": "HEARTH_ALLOW_PRIVATE_MEDIA",
    "max_media_bytes": "HEARTH_MAX_MEDIA_BYTES", "max_video_bytes": "HEARTH_MAX_VIDEO_BYTES",
    "max_audio_seconds": "HEARTH_MAX_AUDIO_SECONDS",
    "media_timeout_s": "HEARTH_MEDIA_TIMEOUT",
}


class LimitError(ValueError):
    """A bound in the environment that cannot be used."""


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """A byte count: `1073741824`, `512MiB`, `2G`, `1.5GB` (powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"expected a size such as 512MiB or 2GiB, got {text!r}")
    return int(float(match.group(1)) * _UNITS[unit])


def _parse(name: str, raw: str, kind):
    if name.endswith("_bytes"):
        try:
            return parse_size(raw)
        except ValueError as exc:
            raise LimitError(f"{ENV[name]}: {exc}") from None
    if kind is bool:
        value = raw.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise LimitError(f"{ENV[name]}={raw!r} is not a boolean")
    try:
        value = kind(raw)
    except ValueError:
        raise LimitError(f"{ENV[name]}={raw!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not (value > 0 and math.isfinite(value)):  # also refuses NaN and inf
        raise LimitError(f"{ENV[name]}={raw!r} must be a finite number greater than 0")
    return value


def from_env(environ=os.environ) -> Limits:
    values = {}
    for f in fields(Limits):
        raw = environ.get(ENV[f.name])
        if raw not in (None, ""):
            values[f.name] = _parse(f.name, raw, type(getattr(DEFAULT, f.name)))
    return Limits(**values)


_current: Limits | None = None


def current() -> Limits:
    """The bounds this process runs with (read from the environment once)."""
    global _current
    if _current is None:
        _current = from_env()
    return _current


def export(limits: Limits, environ=os.environ) -> None:
    """Make `limits` this process's bounds, and its children's."""
    global _current
    for f in fields(Limits):
        value = getattr(limits, f.name)
        environ[ENV[f.name]] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    _current = limits
