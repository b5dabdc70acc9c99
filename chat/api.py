"""`/api/sessions/search`, `/export`, `/import`, the sessions' tool approvals
(`/api/settings/tool-approvals`), and the numbers a chat's sampling settings
take (`/api/sampling-fields`)."""
from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Query, Schema
from pydantic import ConfigDict, Field

from chat import gensettings
from chat.models import ChatEntry, ChatSession
from core.api import ApiError
from core.openapi import documented
from core.surfaces import API
from inference.protocols import params

router = API.router(tags=["sessions"])
MAX_MATCHES, PER_SESSION, CONTEXT = 50, 10, 60


class Revoke(Schema):
    session_id: str = Field(..., min_length=1, description="the chat session")
    tool: str = Field(..., min_length=1, description="the tool that asks again")


class SessionExport(Schema):
    """What `/api/sessions/export` answers: a `session` entry, then `message` entries."""

    model_config = ConfigDict(extra="allow")
    entries: list[dict[str, Any]]


@router.get("/sampling-fields")
def sampling_fields(request: HttpRequest) -> dict:
    """The numbers a chat's `set_sampling` frame takes, in order: every
    sampling field of the HTTP routes (`params.FIELDS`), then `max_tokens`;
    each with its JSON type, range (null: none fixed) and what it does. The
    dashboard draws its sampling panel from this."""
    return {"ok": True, "fields": [{"name": f.name, "type": "integer" if f.kind is int else "number",
                                    "minimum": f.minimum, "maximum": f.maximum, "description": f.description}
                                   for f in (*params.FIELDS, gensettings.MAX_TOKENS)]}


def _snippet(text: str, start: int, end: int) -> dict:
    """About CONTEXT characters either side, plain text, with the match's
    [start, end) offsets inside the snippet."""
    left, right = max(start - CONTEXT, 0), min(end + CONTEXT, len(text))
    prefix, suffix = ("…" if left else ""), ("…" if right < len(text) else "")
    snippet = prefix + text[left:right] + suffix
    return {"snippet": snippet, "ranges": [[start - left + len(prefix), end - left + len(prefix)]]}


@router.get("/sessions/search")
def search(request: HttpRequest, q: str = Query("", description="text to find, any case")) -> dict:
    query = q.strip()
    if not query:
        raise ApiError("q is required")
    pattern = re.compile(re.escape(query), re.IGNORECASE)
    entries = ChatEntry.objects.select_related("session").order_by("-session__updated_at", "created_at")
    if query.isascii():  # SQLite's LIKE folds ASCII case only (PostgreSQL folds more); others are matched in Python
        entries = entries.filter(content__icontains=query)
    results: dict[str, dict] = {}
    total = 0
    for entry in entries.iterator():
        if total >= MAX_MATCHES:
            break
        found = pattern.search(entry.content)
        if found is None:
            continue
        row = results.setdefault(entry.session_id, {"session_path": entry.session_id,
                                                    "session_title": entry.session.title, "matches": []})
        if len(row["matches"]) >= PER_SESSION:
            continue
        row["matches"].append({**_snippet(entry.content, found.start(), found.end()), "role": entry.role,
                               "entry_id": entry.id})
        total += 1
    return {"ok": True, "results": list(results.values())}


@router.get("/sessions/export")
def export(request: HttpRequest, path: str = Query("", description="the session id"),
           file_format: str | None = Query(None, alias="format", description="jsonl downloads it as JSON lines")
           ) -> HttpResponse | dict:
    """The session file: its entries keep the session format's own names
    (`parentId`, `createdAt`, `systemPrompt`, `meta`), which import reads back."""
    if not path:
        raise ApiError("path required")
    session = ChatSession.objects.filter(id=path).first()
    if session is None:
        raise ApiError(f"no session {path}", 404)
    entries = [{"type": "session", "id": session.id, "title": session.title, "systemPrompt": session.system_prompt,
                "createdAt": session.created_at.isoformat(), "leaf": session.leaf_id}]
    for e in session.entries.order_by("created_at"):
        entries.append({"type": "message", "id": e.id, "parentId": e.parent_id, "createdAt": e.created_at.isoformat(),
                        "message": {"role": e.role, "content": e.content, "reasoning": e.reasoning or None},
                        "meta": json.loads(e.meta_json or "{}")})
    if file_format == "jsonl":
        response = HttpResponse("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in entries),
                                content_type="application/x-ndjson")
        response["Content-Disposition"] = f'attachment; filename="{session.id}.jsonl"'
        return response
    return {"ok": True, "path": session.id, "entries": entries}


def _approvals(session_id: str) -> dict:
    from chat import approvals as store

    return {"session_id": session_id, "always_allow": store.allowed(session_id)}


@router.get("/settings/tool-approvals")
def approvals(request: HttpRequest,
              session_id: str | None = Query(None, description="one session only")) -> dict:
    """Every session's always-allowed tools, newest session first."""
    from chat import approvals as store

    if session_id is None:
        return {"ok": True, "sessions": store.every_session()}
    session = ChatSession.objects.filter(id=session_id).first()
    if session is None:
        raise ApiError(f"no session {session_id}", 404)
    return {"ok": True, "sessions": [{**_approvals(session.id), "title": session.title}]}


@router.delete("/settings/tool-approvals")
def forget_approval(request: HttpRequest, body: Revoke) -> dict:
    """That session asks before running the tool again."""
    from chat import approvals as store

    if not ChatSession.objects.filter(id=body.session_id).exists():
        raise ApiError(f"no session {body.session_id}", 404)
    if not store.revoke(body.session_id, body.tool):
        raise ApiError(f"{body.tool} is not always-allowed in session {body.session_id}", 404)
    return {"ok": True, **_approvals(body.session_id)}


class McpConfig(Schema):
    """MCP servers (chat/mcp.py): what mcp.json holds under `mcpServers`."""

    servers: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description='name -> {"command", "args"?, "env"?, "cwd"?} (stdio) or '
                                          '{"url", "headers"?} (streamable HTTP); a value shown as ******** '
                                          "keeps the stored one")


def _mcp_answer(servers: dict) -> dict:
    from chat import mcp

    return {"ok": True, "servers": mcp.masked(servers), "status": mcp.status(), "path": str(mcp.config_path())}


@router.get("/settings/mcp")
async def mcp_servers(request: HttpRequest) -> dict:
    """The configured MCP servers (secrets masked) and what each offers, or why it offers nothing."""
    from chat import mcp

    try:
        servers = mcp.load()
    except mcp.ConfigError as exc:
        raise ApiError(str(exc), 409) from None
    await mcp.ensure_listed()
    return _mcp_answer(servers)


def may_run_commands(request: HttpRequest) -> bool:
    """As for the chat's coding tools: signed in (a key or the dashboard's
    session, when keys are required) or from this machine's loopback."""
    from django.conf import settings

    if getattr(request, "hearth_signed_in", False):
        return True
    peer = None if settings.HEARTH_BEHIND_PROXY else request.META.get("REMOTE_ADDR")
    try:
        address = ipaddress.ip_address(peer) if peer else None
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address is not None and address.is_loopback


@router.put("/settings/mcp")
async def save_mcp_servers(request: HttpRequest, body: McpConfig) -> dict:
    """Store the MCP servers and list their tools now (the answer says which started).
    A stdio server is a command this machine runs: only a signed-in or local caller may set one."""
    from chat import mcp

    if not may_run_commands(request):
        raise ApiError("MCP servers run commands on this machine: configure them from this machine, or sign in "
                       "(start the server with --api-key)", 403)
    if not mcp.commands_allowed() and any("command" in e for e in body.servers.values() if isinstance(e, dict)):
        raise ApiError("this server runs no MCP commands (HEARTH_MCP_COMMANDS=0): only servers with a url", 403)
    try:
        servers = mcp.save({"mcpServers": body.servers})
    except mcp.ConfigError as exc:
        raise ApiError(str(exc)) from None
    await mcp.refresh()
    return _mcp_answer(servers)


@router.post("/sessions/import", openapi_extra=documented(SessionExport, {
    "application/x-ndjson": {"schema": {"type": "string", "description": "the JSONL export, one entry a line"}}}))
def import_session(request: HttpRequest) -> dict:
    """A session exported by `/api/sessions/export` (JSON, or JSONL with an
    ndjson/jsonl content type), stored as a new session."""
    from chat import transfer

    try:
        session = transfer.restore(transfer.parse(request.body, request.content_type or ""))
    except (transfer.BadExport, UnicodeDecodeError) as exc:
        raise ApiError(str(exc)) from None
    return {"ok": True, "path": session.id, "title": session.title, "message_count": session.entries.count()}
