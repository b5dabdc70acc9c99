"""Preset files of router mode: `hearth serve --models-preset FILE`.

An INI file with one section per model (`[vendor/model]`) and an optional
`[*]` section that every model takes under its own (see `merged`). Every
rule is strict, and a broken one is a `PresetError` whose message starts
with `FILE:LINE: `:

- `[name]`: any non-empty text without `]`, spaces around it stripped; each
  section at most once.
- `key = value`: a key from `KEYS`, inside a section, at most once per
  section, with a non-empty value its key's parser accepts. The keys are
  the `hearth serve` flags marked `preset` in their one declaration
  (`serving.serve_flags`), named without the dashes and read by the same
  parser as the flag (`true`/`false` for an on/off flag), and the router's
  own `alias`, `tags` and `pin`.
- `#` or `;` at the start of a line or after whitespace starts a comment;
  blank lines are skipped; any other line is an error.
- Paths (`adapter`, `ssd-cache`) expand `~` and are relative to the file's
  folder, since the child process may run elsewhere; `adapter` must be a
  directory.
- `alias` and `tags` are comma-separated names, duplicates dropped; `alias`
  is refused in `[*]`, since an alias names one model.

Serve options become the child process's flags (`Preset.child_args`); the
router's own keys (`alias`, `tags`, `pin`) and its settings per model
(`idle-unload`, a flag marked `SETTING`) become fields.
Parsed by hand: configparser reports no line for a bad value and accepts more
(continuation lines, `:` for `=`, keys in any case).
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core import argtypes
from serving import serve_flags


class PresetError(ValueError):
    """A preset file that cannot be used; the message starts with `FILE:LINE: `, or `FILE: ` for the file as a whole."""


@dataclass(frozen=True)
class Preset:
    name: str
    source: str  # "FILE:LINE" of the section header, "" for a section not in the file
    flags: dict[str, object] = field(default_factory=dict)  # serve option as written -> value, file order
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    pinned: bool | None = None  # None: not set
    idle_unload: float | None = None  # seconds, 0 for never; None: not set

    def child_args(self) -> list[str]:
        """The flags for `hearth serve`: `["--batch", "4", "--keep-dtype", ...]`; a boolean adds its
        flag when true and nothing when false (the serve flags are `store_true`)."""
        args: list[str] = []
        for key, value in self.flags.items():
            if value is True:
                args.append(f"--{key}")
            elif value is not False:
                args += [f"--{key}", str(value)]
        return args


# Keys of the router's own that are no `hearth serve` flag -> (Preset field, parser).
_ROUTER: dict[str, tuple[str, Callable[[str], object]]] = {
    "alias": ("aliases", argtypes.names),
    "tags": ("tags", argtypes.names),
    "pin": ("pinned", argtypes.boolean),
}
# Every key: the serve flags a preset may set (`serving.serve_flags`, those marked `preset`) and the router's own.
KEYS: frozenset[str] = frozenset(serve_flags.PRESET_KEYS) | frozenset(_ROUTER)

_COMMENT = re.compile(r"(?:^|\s)[#;]")
_SECTION = re.compile(r"\[([^\]]*)\]")
_KEY = re.compile(r"[a-z][a-z0-9-]*")


def _value(key: str, text: str, base: Path) -> object:
    if key in _ROUTER:
        return _ROUTER[key][1](text)
    flag = serve_flags.PRESET_KEYS[key]
    if flag.path:
        path = os.path.abspath(base / Path(text).expanduser())  # an absolute `text` replaces `base`
        if key == "adapter" and not os.path.isdir(path):
            raise ValueError(f"no such directory: {path}")
        return path
    if flag.switch:
        return argtypes.boolean(text)
    parse = flag.preset_parse or flag.parse
    return text if parse is None else parse(text)


def _read(file: str) -> str:
    try:
        return Path(file).read_text(encoding="utf-8-sig")  # universal newlines: CRLF reads as LF
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise PresetError(f"{file}: cannot read: {reason}") from None


class _Section:
    """A section while its lines are read: the values so far and the line of each key."""

    def __init__(self, name: str, file: str, line: int) -> None:
        self.name, self.source, self.line = name, f"{file}:{line}", line
        self.lines: dict[str, int] = {}
        self.flags: dict[str, object] = {}
        self.fields: dict[str, Any] = {}

    def preset(self) -> Preset:
        return Preset(name=self.name, source=self.source, flags=self.flags, **self.fields)


def parse(path: str | os.PathLike[str]) -> dict[str, Preset]:
    """Section name -> its `Preset`, in file order, `*` included when present."""
    file = os.fspath(path)
    base = Path(file).absolute().parent
    sections: dict[str, _Section] = {}
    current: _Section | None = None
    for number, raw in enumerate(_read(file).split("\n"), 1):
        comment = _COMMENT.search(raw)
        line = (raw[: comment.start()] if comment else raw).strip()
        if not line:
            continue
        where = f"{file}:{number}"
        header = _SECTION.fullmatch(line)
        if header:
            name = header.group(1).strip()
            if not name:
                raise PresetError(f"{where}: empty section name")
            if name in sections:
                raise PresetError(f"{where}: duplicate section [{name}] (first at line {sections[name].line})")
            current = sections[name] = _Section(name, file, number)
        else:
            _setting(current, line, where, number, base)
    return {name: section.preset() for name, section in sections.items()}


def _setting(section: _Section | None, line: str, where: str, number: int, base: Path) -> None:
    """One `key = value` line into `section`."""
    key, equals, text = line.partition("=")
    key, text = key.strip(), text.strip()
    if not equals or not _KEY.fullmatch(key):
        raise PresetError(f"{where}: expected '[section]' or 'key = value' (key in lowercase), got {line!r}")
    if key not in KEYS:
        raise PresetError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(KEYS))})")
    if section is None:
        raise PresetError(f"{where}: {key}: a setting before any [section]")
    if key in section.lines:
        raise PresetError(f"{where}: duplicate key {key!r} in [{section.name}] (first at line {section.lines[key]})")
    if not text:
        raise PresetError(f"{where}: {key}: empty value")
    if key == "alias" and section.name == "*":
        raise PresetError(f"{where}: alias: not allowed in [*], since an alias names one model")
    try:
        value = _value(key, text, base)
    except ValueError as exc:
        raise PresetError(f"{where}: {key}: {exc}") from None
    section.lines[key] = number
    if key in _ROUTER:
        section.fields[_ROUTER[key][0]] = value
    elif serve_flags.PRESET_KEYS[key].preset == serve_flags.SETTING:
        section.fields[serve_flags.PRESET_KEYS[key].target] = value
    else:
        section.flags[key] = value


def merged(presets: dict[str, Preset], name: str) -> Preset:
    """The `[*]` section under the `[name]` section: the flags of both (name's win); name's aliases only,
    since an alias names one model; the tags of `*` then name's; pin and idle-unload from name, else from `*`.
    A section not in `presets` counts as empty."""
    own = presets.get(name) or Preset(name=name, source="")
    star = presets.get("*") if name != "*" else None
    if star is None:
        return own
    return Preset(
        name=name, source=own.source, flags={**star.flags, **own.flags}, aliases=own.aliases,
        tags=tuple(dict.fromkeys(star.tags + own.tags)),
        pinned=own.pinned if own.pinned is not None else star.pinned,
        idle_unload=own.idle_unload if own.idle_unload is not None else star.idle_unload,
    )
