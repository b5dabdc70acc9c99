"""The dashboard chat's server-side tools.

Two sources: tools other apps register (memory's read-only tools, never
gated, offered once a vault exists; `memory/tools.py`) and the coding tools,
offered only when the session turned them on. The coding tools work inside one workspace folder
(`HEARTH_CHAT_WORKSPACE`, default `HEARTH_HOME/workspace`); every path is
resolved, symlinks included, and refused when it leaves that folder.
`bash`, `edit` and `write` change the machine, so they are gated by the
approval card unless the user always-allowed them in that chat session
(`chat/approvals.py`). Nothing a `bash` call starts outlives the call
(`chat/reaper.py`).

A tool never raises at the model: bad arguments and failures come back as
a short error text, which is what the model reads as the tool's result."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chat.reaper import kill_tree
from core import procs
from core.fs import write_atomically
from core.paths import PathRefused, read_text

REAPER = str(Path(__file__).with_name("reaper.py"))
READ_CAP = 20_000  # characters of a file `read` returns
OUTPUT_CAP = 20_000  # bytes of `bash` output kept
BASH_TIMEOUT, BASH_TIMEOUT_MAX = 60, 600
WRITE_CAP = 2_000_000
CODING = ("read", "bash", "edit", "write")

Emit = Callable[[str], Awaitable[None]]


class ToolError(Exception):
    """A failure the model is told about as the tool's result."""


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict
    gated: bool
    run: Callable[[dict], str]
    stream: Callable[[dict, Emit], Awaitable[str]] | None = None  # async, with live output
    # async, acting on the running turn (writing frames to its stream): the app-aware tools, chat/appctx.py
    act: Callable[[dict, Any], Awaitable[tuple[bool, str]]] | None = None

    def spec(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


# -- the workspace -----------------------------------------------------------
def workspace() -> Path:
    from django.conf import settings

    root = Path(settings.CHAT_WORKSPACE)
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def resolve(path: str) -> Path:
    """`path` (relative to the workspace, or absolute) with symlinks followed;
    refused when the result is not inside the workspace."""
    root = workspace()
    target = (root / path).resolve()  # an absolute `path` replaces root
    if target != root and root not in target.parents:
        raise ToolError(f"path {path!r} is outside the workspace ({root})")
    return target


# -- arguments ---------------------------------------------------------------
_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list}


def check_args(args, schema: dict) -> str | None:
    """A short complaint when `args` break the schema's required keys or
    property types; None when they pass."""
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    props = schema.get("properties") or {}
    missing = [k for k in schema.get("required") or [] if k not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    for key, value in args.items():
        kind = (props.get(key) or {}).get("type")
        if key not in props and schema.get("additionalProperties") is False:
            return f"unknown argument {key!r}"
        expected = _TYPES.get(kind) if isinstance(kind, str) else None
        if expected is None:
            continue
        wrong = not isinstance(value, expected) or (isinstance(value, bool) and kind in ("integer", "number"))
        if wrong:
            return f"argument {key!r} must be of type {kind}"
    return None


# -- coding tools ------------------------------------------------------------
def _existing_file(raw: str) -> Path:
    """The workspace file `raw` names: refused when missing, a folder, or
    anything but a regular file (a FIFO would block the read forever, a
    device could stream without end), before anything opens it."""
    path = resolve(raw)
    if not path.exists() or path.is_dir():
        raise ToolError(f"no file {raw!r} in the workspace")
    if not path.is_file():
        raise ToolError(f"path: {raw} is not a regular file")
    return path


def _text(path: Path, raw: str, errors: str) -> str:
    """The file's text, read through open_regular (which checks the opened descriptor again)."""
    try:
        return read_text(path, "path", encoding="utf-8", errors=errors)
    except PathRefused:
        raise ToolError(f"path: {raw} is not a regular file") from None
    except OSError as exc:
        raise ToolError(f"cannot read {raw!r}: {exc.strerror or exc}") from None


def _read(args: dict) -> str:
    path = _existing_file(args["path"])
    offset = max(int(args.get("offset") or 1), 1)
    limit = int(args.get("limit") or 2000)
    lines = _text(path, args["path"], "replace").splitlines()
    out, size = [], 0
    for number, line in enumerate(lines[offset - 1: offset - 1 + limit], start=offset):
        row = f"{number:6}\t{line}"
        size += len(row) + 1
        if size > READ_CAP:
            out.append(f"… (cut at {READ_CAP} characters; read on with offset={number})")
            break
        out.append(row)
    return "\n".join(out) if out else "(empty file)" if not lines else f"(the file has {len(lines)} lines)"


def _atomic_write(path: Path, text: str) -> None:
    write_atomically(path, text, durable=False)


def _write(args: dict) -> str:
    content = args["content"]
    if len(content) > WRITE_CAP:
        raise ToolError(f"content is over {WRITE_CAP} characters")
    path = resolve(args["path"])
    if path.is_dir():
        raise ToolError(f"{args['path']!r} is a folder")
    if path.exists() and not path.is_file():  # a FIFO, device or socket is left as it is
        raise ToolError(f"path: {args['path']} is not a regular file")
    existed = path.exists()
    _atomic_write(path, content)
    return f"{'overwrote' if existed else 'created'} {path.relative_to(workspace())} ({len(content)} characters)"


def _edit(args: dict) -> str:
    old, new = args["old_string"], args["new_string"]
    if not old:
        raise ToolError("old_string must not be empty")
    path = _existing_file(args["path"])
    text = _text(path, args["path"], "strict")
    count = text.count(old)
    if count != 1:
        raise ToolError(f"old_string occurs {count} times in {args['path']!r}; it must occur exactly once")
    _atomic_write(path, text.replace(old, new, 1))
    return f"edited {path.relative_to(workspace())}"


def _bash_sync(args: dict) -> str:
    return asyncio.run(_bash(args, _discard))


async def _discard(chunk: str) -> None:
    return None


async def _bash(args: dict, emit: Emit) -> str:
    """Run the command under `chat/reaper.py` in a session of its own,
    streaming its output. Nothing it starts outlives the call: what is left
    when the command exits is killed by the reaper, and a timeout or a
    cancelled turn (abort, disconnect) kills the whole tree, processes that
    called `setsid` or double-forked included."""
    timeout = args.get("timeout", BASH_TIMEOUT)
    if not 1 <= timeout <= BASH_TIMEOUT_MAX:
        raise ToolError(f"timeout must be between 1 and {BASH_TIMEOUT_MAX} seconds")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", REAPER, "bash", "-lc", args["command"], cwd=workspace(), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        **procs.tied(hide=procs.SECRET_ENV, on_parent_exit=signal.SIGTERM))  # the reaper ends its tree
    kept, dropped = bytearray(), 0

    async def pump():
        nonlocal dropped
        assert proc.stdout is not None  # stdout=PIPE
        while chunk := await proc.stdout.read(4096):
            room = OUTPUT_CAP - len(kept)
            kept.extend(chunk[:room])
            dropped += max(len(chunk) - room, 0)
            if room > 0:
                await emit(chunk[:room].decode("utf-8", errors="replace"))
        await proc.wait()

    timed_out = False
    try:
        await asyncio.wait_for(pump(), timeout)
    except asyncio.TimeoutError:
        timed_out = True
    finally:
        if proc.returncode is None:
            _kill(proc.pid)
            try:  # the wait also waits for the output pipe, which a process out of reach could hold
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                pass
    text = kept.decode("utf-8", errors="replace")
    if dropped:
        text += f"\n… ({dropped} more bytes of output dropped)"
    if timed_out:
        raise ToolError(f"{text}\n(killed after {timeout} s)".lstrip())
    if proc.returncode:
        raise ToolError(f"{text}\n(exit code {proc.returncode})".lstrip())
    return text or "(no output)"


def _kill(pid: int) -> None:
    kill_tree(pid)  # the reaper and every process below it, whatever its session
    try:
        os.killpg(pid, signal.SIGKILL)  # and any of the group that left the tree
    except (ProcessLookupError, PermissionError):
        pass


def _path_prop(what: str) -> dict:
    return {"type": "string", "description": f"{what}, relative to the workspace folder"}


CODING_TOOLS = {t.name: t for t in [
    Tool("read", "Read a text file from the workspace, with line numbers.",
         {"type": "object", "properties": {"path": _path_prop("The file"),
                                           "offset": {"type": "integer", "description": "First line (1-based)"},
                                           "limit": {"type": "integer", "description": "Most lines to return"}},
          "required": ["path"]}, gated=False, run=_read),
    Tool("bash", "Run a bash command in the workspace folder and return its output (stdout and stderr). "
                 "Processes it starts in the background end when the command returns.",
         {"type": "object", "properties": {"command": {"type": "string"},
                                           "timeout": {"type": "integer",
                                                       "description": f"Seconds (default {BASH_TIMEOUT}, "
                                                                      f"at most {BASH_TIMEOUT_MAX})"}},
          "required": ["command"]}, gated=True, run=_bash_sync, stream=_bash),
    Tool("edit", "Replace one exact, unique occurrence of old_string with new_string in a workspace file.",
         {"type": "object", "properties": {"path": _path_prop("The file"), "old_string": {"type": "string"},
                                           "new_string": {"type": "string"}},
          "required": ["path", "old_string", "new_string"]}, gated=True, run=_edit),
    Tool("write", "Create or overwrite a file in the workspace with the given content.",
         {"type": "object", "properties": {"path": _path_prop("The file"), "content": {"type": "string"}},
          "required": ["path", "content"]}, gated=True, run=_write),
]}


# -- the registry ------------------------------------------------------------
# Other apps add tools by registering a provider: a function answering the
# tools it offers right now (memory offers its read-only tools once a vault
# exists; see memory/apps.py). Their failures raise ToolError like ours.
_PROVIDERS: list[Callable[[], dict[str, Tool]]] = []


def register_provider(provider: Callable[[], dict[str, Tool]]) -> None:
    if provider not in _PROVIDERS:
        _PROVIDERS.append(provider)


def available(coding: bool) -> dict[str, Tool]:
    """The tools a turn offers: the registered apps' (memory's once a vault
    exists), and the coding tools when the session switched them on."""
    out: dict[str, Tool] = {}
    for provider in _PROVIDERS:
        out.update(provider())
    return {**out, **(CODING_TOOLS if coding else {})}


def specs(tools: dict[str, Tool]) -> list[dict]:
    return [t.spec() for t in tools.values()]


def call_sync(tool: Tool, args) -> tuple[bool, str]:
    """Run a tool (ORM and disk work allowed: call it through sync_to_async)."""
    problem = check_args(args, tool.parameters)
    if problem:
        return False, f"error: {problem}"
    try:
        return True, str(tool.run(args))
    except ToolError as exc:
        return False, f"error: {exc}"
    except Exception as exc:  # the model is told, the chat goes on
        return False, f"error: {type(exc).__name__}: {exc}"


async def call_streaming(tool: Tool, args, emit: Emit) -> tuple[bool, str]:
    problem = check_args(args, tool.parameters)
    if problem:
        return False, f"error: {problem}"
    assert tool.stream is not None  # called for the tools that stream
    try:
        return True, await tool.stream(args, emit)
    except ToolError as exc:
        return False, f"error: {exc}"
    except (OSError, ValueError) as exc:
        return False, f"error: {type(exc).__name__}: {exc}"



