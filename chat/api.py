"""`/api/sessions/search`, `/export`, `/import`, and the sessions' tool approvals
(`/api/settings/tool-approvals`)."""
from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse
from ninja import Router

from chat.models import ChatEntry, ChatSession
from core.api import fail, json_body

router = Router(tags=["sessions"])
MAX_MATCHES, PER_SESSION, CONTEXT = 50, 10, 60


def _snippet(text: str, start: int, end: int) -> dict:
    """About CONTEXT characters either side, plain text, with the match's
    [start, end) offsets inside the snippet."""
    left, right = max(start - CONTEXT, 0), min(end + CONTEXT, len(text))
    prefix, suffix = ("…" if left else ""), ("…" if right < len(text) else "")
    snippet = prefix + text[left:right] + suffix
    return {"snippet": snippet, "ranges": [[start - left + len(prefix), end - left + len(prefix)]]}


@router.get("/sessions/search")
def search(request: HttpRequest):
    import re

    query = (request.GET.get("q") or "").strip()
    if not query:
        return fail("q is required")
    pattern = re.compile(re.escape(query), re.IGNORECASE)
    entries = ChatEntry.objects.select_related("session").order_by("-session__updated_at", "created_at")
    if query.isascii():  # SQLite's LIKE folds ASCII case only; other queries are matched here in Python
        entries = entries.filter(content__icontains=query)
    results, total = {}, 0
    for entry in entries.iterator():
        if total >= MAX_MATCHES:
            break
        found = pattern.search(entry.content)
        if found is None:
            continue
        row = results.setdefault(entry.session_id, {"sessionPath": entry.session_id,
                                                    "sessionTitle": entry.session.title, "matches": []})
        if len(row["matches"]) >= PER_SESSION:
            continue
        row["matches"].append({**_snippet(entry.content, found.start(), found.end()), "role": entry.role,
                               "entryId": entry.id})
        total += 1
    return {"ok": True, "results": list(results.values())}


@router.get("/sessions/export")
def export(request: HttpRequest):
    key = request.GET.get("path") or request.GET.get("id")
    if not key:
        return fail("path required")
    session = ChatSession.objects.filter(id=key).first()
    if session is None:
        return fail(f"no session {key}", 404)
    entries = [{"type": "session", "id": session.id, "title": session.title, "systemPrompt": session.system_prompt,
                "createdAt": session.created_at.isoformat(), "leaf": session.leaf_id}]
    for e in session.entries.order_by("created_at"):
        entries.append({"type": "message", "id": e.id, "parentId": e.parent_id, "createdAt": e.created_at.isoformat(),
                        "message": {"role": e.role, "content": e.content, "reasoning": e.reasoning or None},
                        "meta": json.loads(e.meta_json or "{}")})
    if request.GET.get("format") == "jsonl":
        response = HttpResponse("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in entries),
                                content_type="application/x-ndjson")
        response["Content-Disposition"] = f'attachment; filename="{session.id}.jsonl"'
        return response
    return {"ok": True, "path": session.id, "entries": entries}


@router.get("/settings/tool-approvals")
def approvals(request: HttpRequest):
    """Every session's always-allowed tools; `?sessionId=` narrows it to one session."""
    from chat import approvals as store

    key = request.GET.get("sessionId")
    if key is None:
        return {"ok": True, "sessions": store.every_session()}
    session = ChatSession.objects.filter(id=key).first()
    if session is None:
        return fail(f"no session {key}", 404)
    return {"ok": True, "sessions": [{"sessionId": session.id, "title": session.title,
                                      "alwaysAllow": store.allowed(session.id)}]}


@router.delete("/settings/tool-approvals")
def forget_approval(request: HttpRequest):
    """`{"sessionId", "tool"}`: that session asks before running the tool again."""
    from chat import approvals as store

    body = json_body(request)
    if isinstance(body, HttpResponse):
        return body
    key, tool = body.get("sessionId"), body.get("tool")
    if not isinstance(key, str) or not key:
        return fail("sessionId required")
    if not isinstance(tool, str) or not tool:
        return fail("tool required")
    if not ChatSession.objects.filter(id=key).exists():
        return fail(f"no session {key}", 404)
    if not store.revoke(key, tool):
        return fail(f"{tool} is not always-allowed in session {key}", 404)
    return {"ok": True, "sessionId": key, "alwaysAllow": store.allowed(key)}


@router.post("/sessions/import")
def import_session(request: HttpRequest):
    """A session exported by `/api/sessions/export` (JSON, or JSONL with an
    ndjson/jsonl content type), stored as a new session."""
    from chat import transfer

    try:
        session = transfer.restore(transfer.parse(request.body, request.content_type or ""))
    except (transfer.BadExport, UnicodeDecodeError) as exc:
        return fail(str(exc))
    return {"ok": True, "path": session.id, "title": session.title, "messageCount": session.entries.count()}
