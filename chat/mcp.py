"""Tools of MCP servers in the dashboard chat, through the official `mcp` SDK.

The servers are configured in HEARTH_HOME/mcp.json, in the shape other MCP
clients use, so an existing configuration can be pasted in:

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
        "search": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer …"}}}}

A server with `command` runs as a child process over stdio (`args`, `env`
and `cwd` optional); one with `url` is reached over streamable HTTP
(`headers` optional). The Settings page edits the file through
`/api/settings/mcp`. Each server's tools are listed when the file changes
(a turn checks its modification time) and offered to the chat as
`<server>__<tool>`, gated by the approval card like the coding tools: a
tool runs with whatever its server can reach. A call opens a session,
calls the tool and closes it, so no server process outlives a call.
"""
from __future__ import annotations

import json
import logging
import re
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from chat.tools import Emit, Tool, ToolError
from core import home
from core.fs import write_atomically

log = logging.getLogger("hearth.chat.mcp")

LIST_TIMEOUT_S = 20.0  # a stdio server may need to install itself on its first start (npx, uvx)
CALL_TIMEOUT_S = 120.0
RESULT_CAP = 20_000  # characters of a tool's result the model reads
MASK = "********"  # a header or env value as GET shows it; sent back, it keeps the stored value
_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
_TOOL_CHARS = re.compile(r"[^A-Za-z0-9_-]")


class ConfigError(ValueError):
    """mcp.json, or a configuration sent to be saved, that cannot be used; the text says where."""


@dataclass
class ServerState:
    tools: list[dict] = field(default_factory=list)  # {name, description, parameters} as the server lists them
    error: str | None = None


_state: dict[str, ServerState] = {}
_listed_mtime: float | None = None
_lock: anyio.Lock | None = None


def config_path() -> Path:
    return home.mcp_config()


# -- the configuration ---------------------------------------------------------------------

def load() -> dict[str, dict]:
    """The configured servers (an absent file: none)."""
    path = config_path()
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return validate(raw)


def commands_allowed() -> bool:
    from django.conf import settings

    return bool(settings.HEARTH_MCP_COMMANDS)


def validate(raw) -> dict[str, dict]:
    """The servers of a configuration (`mcpServers`, or `servers`), checked."""
    servers = raw.get("mcpServers", raw.get("servers", {})) if isinstance(raw, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError('expected {"mcpServers": {"<name>": {"command": …} or {"url": …}}}')
    out = {}
    for name, entry in servers.items():
        where = f"mcpServers.{name}"
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{where}: a server's name is 1-32 letters, digits, '_' or '-'")
        if not isinstance(entry, dict) or ("command" in entry) == ("url" in entry):
            raise ConfigError(f"{where}: give either `command` (stdio) or `url` (streamable HTTP)")
        if "command" in entry:
            out[name] = _stdio_entry(entry, where)
        else:
            url = entry["url"]
            if not isinstance(url, str) or not re.match(r"https?://", url):
                raise ConfigError(f"{where}.url: an http(s) URL")
            out[name] = {"url": url, "headers": _strings(entry.get("headers", {}), f"{where}.headers")}
    return out


def _stdio_entry(entry: dict, where: str) -> dict:
    command, args = entry["command"], entry.get("args", [])
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(f"{where}.command: the program to run")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}.args: a list of strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{where}.cwd: a folder")
    return {"command": command, "args": args, "env": _strings(entry.get("env", {}), f"{where}.env"),
            **({"cwd": cwd} if cwd else {})}


def _strings(value, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"{where}: an object of strings")
    return value


def save(raw) -> dict[str, dict]:
    """Check and store a configuration; a masked value keeps the stored one."""
    servers = validate(raw)
    stored = load()
    for name, entry in servers.items():
        for secret in ("env", "headers"):
            old = stored.get(name, {}).get(secret, {})
            entry.get(secret, {}).update({k: old[k] for k, v in entry.get(secret, {}).items()
                                          if v == MASK and k in old})
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps({"mcpServers": servers}, indent=2).encode())
    return servers


def masked(servers: dict[str, dict]) -> dict[str, dict]:
    """The configuration as the dashboard shows it: no secret values."""
    return {name: {**entry, **{s: {k: MASK for k in entry[s]} for s in ("env", "headers") if s in entry}}
            for name, entry in servers.items()}


# -- listing ---------------------------------------------------------------------------------

def _client(entry: dict) -> AbstractAsyncContextManager:
    from mcp import Client, StdioServerParameters

    if "url" in entry:
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

        http = create_mcp_http_client(headers=entry["headers"]) if entry["headers"] else None
        return Client(streamable_http_client(entry["url"], http_client=http))
    # The SDK starts the process with a few safe variables (PATH, HOME, …) and `env` over them: never
    # this server's keys.
    return Client(StdioServerParameters(command=entry["command"], args=entry["args"], env=entry["env"] or None,
                                        cwd=entry.get("cwd")))


async def _list(entry: dict) -> list[dict]:
    with anyio.fail_after(LIST_TIMEOUT_S):
        async with _client(entry) as client:
            listed = await client.list_tools()
    return [{"name": t.name, "description": t.description or "",
             "parameters": t.input_schema or {"type": "object", "properties": {}}} for t in listed.tools]


async def refresh() -> dict[str, ServerState]:
    """List every configured server's tools again (one failing server says why and offers none)."""
    global _listed_mtime, _lock
    _lock = _lock or anyio.Lock()
    async with _lock:
        path = config_path()
        mtime = path.stat().st_mtime if path.exists() else None
        try:
            servers = load()
        except ConfigError as exc:
            log.warning("MCP: %s", exc)
            servers = {}
        state: dict[str, ServerState] = {}
        for name, entry in servers.items():
            if "command" in entry and not commands_allowed():
                state[name] = ServerState(error="this server runs no MCP commands (HEARTH_MCP_COMMANDS=0)")
                continue
            try:
                state[name] = ServerState(tools=await _list(entry))
            except Exception as exc:  # a server that does not start or answer: shown in Settings, tools not offered
                state[name] = ServerState(error=_reason(exc))
                log.warning("MCP server %s: %s", name, state[name].error)
        _state.clear()
        _state.update(state)
        _listed_mtime = mtime
        return dict(_state)


async def ensure_listed() -> None:
    """Before a turn: list again if mcp.json changed since the last listing."""
    path = config_path()
    mtime = path.stat().st_mtime if path.exists() else None
    if mtime != _listed_mtime:
        await refresh()


def status() -> dict[str, dict]:
    return {name: {"tools": [t["name"] for t in s.tools], "error": s.error} for name, s in _state.items()}


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    while getattr(exc, "exceptions", None):  # an exception group (anyio task groups wrap the cause)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    return f"{type(exc).__name__}: {exc}"[:500]


# -- the chat's tools ----------------------------------------------------------------------------

def provider() -> dict[str, Tool]:
    """Every listed MCP tool, gated (registered with chat.tools)."""
    out = {}
    for server, state in _state.items():
        for spec in state.tools:
            name = f"{server}__{_TOOL_CHARS.sub('_', spec['name'])}"[:64]
            out[name] = Tool(name=name, description=f"[{server}] {spec['description']}".strip(),
                             parameters=spec["parameters"], gated=True, run=_not_sync,
                             stream=_caller(server, spec["name"]))
    return out


def _not_sync(args: dict) -> str:
    raise ToolError("MCP tools run on the event loop")


def _caller(server: str, tool: str):
    async def call(args: dict, emit: Emit) -> str:
        entry = load().get(server)
        if entry is None:
            raise ToolError(f"the MCP server {server!r} is no longer configured")
        if "command" in entry and not commands_allowed():
            raise ToolError("this server runs no MCP commands (HEARTH_MCP_COMMANDS=0)")
        try:
            with anyio.fail_after(CALL_TIMEOUT_S):
                async with _client(entry) as client:
                    result = await client.call_tool(tool, args)
        except Exception as exc:
            raise ToolError(f"MCP server {server}: {_reason(exc)}") from None
        text = _text(result)
        if getattr(result, "is_error", False):
            raise ToolError(text or "the tool failed")
        return text

    return call


def _text(result) -> str:
    parts = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        parts.append(item.text if kind == "text" else f"[{kind} content]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    return text if len(text) <= RESULT_CAP else text[:RESULT_CAP] + "\n[truncated]"
