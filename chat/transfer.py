"""Bringing a session back from its export (`/api/sessions/export`): the
same JSON entries (or JSONL lines) become a new session with fresh ids, its
branches and showing leaf intact."""
from __future__ import annotations

import json

from django.db import transaction

from chat.models import ChatEntry, ChatSession
from core import jsonbody, limits

MAX_ENTRIES = 20_000


class BadExport(ValueError):
    pass


def parse(raw: bytes, content_type: str) -> list[dict]:
    """Entries from a JSON body ({"entries": [...]}) or JSONL lines."""
    text = raw.decode("utf-8", errors="strict") if raw else ""
    depth = limits.current().max_json_depth
    if "ndjson" in content_type or "jsonl" in content_type:
        try:
            return [jsonbody.loads(line, depth, "JSONL line") for line in text.splitlines() if line.strip()]
        except jsonbody.JsonRefused as exc:
            raise BadExport(str(exc)) from None
    try:
        body = jsonbody.loads(text or "{}", depth)
    except jsonbody.JsonRefused as exc:
        raise BadExport(str(exc)) from None
    entries = body.get("entries") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        raise BadExport("entries required: the list /api/sessions/export returns")
    return entries


def restore(entries: list[dict]) -> ChatSession:
    if not entries or not isinstance(entries[0], dict) or entries[0].get("type") != "session":
        raise BadExport("the first entry must be the session ({\"type\": \"session\", ...})")
    if len(entries) > MAX_ENTRIES:
        raise BadExport(f"at most {MAX_ENTRIES} entries")
    head, messages = entries[0], entries[1:]
    roles = {r for r, _ in ChatEntry.ROLES}
    for i, item in enumerate(messages, 1):
        message = item.get("message") if isinstance(item, dict) else None
        if not isinstance(message, dict) or item.get("type") != "message" or not isinstance(item.get("id"), str):
            raise BadExport(f"entries[{i}] is not a message entry with an id")
        if not isinstance(message.get("role"), str) or message["role"] not in roles \
                or not isinstance(message.get("content"), str):
            raise BadExport(f"entries[{i}].message needs a role ({', '.join(sorted(roles))}) and text content")
        if not isinstance(message.get("reasoning") or "", str):
            raise BadExport(f"entries[{i}].message.reasoning must be text or null")
        if not (item.get("parentId") is None or isinstance(item.get("parentId"), str)):
            raise BadExport(f"entries[{i}].parentId must be an id or null")
        if not isinstance(item.get("meta", {}), dict) or not _rounds_ok(item.get("meta", {}).get("toolRounds")):
            raise BadExport(f"entries[{i}].meta must be an object (toolRounds: [{{text, calls: [{{id, tool, "
                            f"args, ok, result}}]}}])")
    if not (head.get("leaf") is None or isinstance(head.get("leaf"), str)):
        raise BadExport("the session's leaf must be an entry id or null")
    for key in ("title", "systemPrompt"):
        if not (head.get(key) is None or isinstance(head.get(key), str)):
            raise BadExport(f"the session's {key} must be text or null")
    title, system = head.get("title") or "Imported chat", head.get("systemPrompt")
    with transaction.atomic():
        session = ChatSession.objects.create(title=title[:200] or "Imported chat", system_prompt=system)
        made: dict[str, ChatEntry] = {}
        for i, item in enumerate(messages, 1):
            parent_id = item.get("parentId")
            if parent_id is not None and parent_id not in made:
                raise BadExport(f"entries[{i}].parentId {parent_id!r} is not an earlier entry")
            message = item["message"]
            parent = None if parent_id is None else made[parent_id]
            made[item["id"]] = ChatEntry.objects.create(
                session=session, parent=parent, role=message["role"], content=message["content"],
                reasoning=message.get("reasoning") or "", meta_json=json.dumps(item.get("meta") or {}))
        leaf = head.get("leaf")
        session.leaf = made.get(leaf) if leaf in made else (list(made.values())[-1] if made else None)
        session.save()
    return session


def _rounds_ok(rounds) -> bool:
    """Tool rounds as the chat stores them (they are replayed to the model)."""
    if rounds is None:
        return True
    if not isinstance(rounds, list):
        return False
    for r in rounds:
        if not isinstance(r, dict) or not isinstance(r.get("text", ""), str) or not isinstance(r.get("calls"), list):
            return False
        for c in r["calls"]:
            if not isinstance(c, dict) or not isinstance(c.get("id"), str) or not isinstance(c.get("tool"), str) \
                    or not isinstance(c.get("result", ""), str):
                return False
    return True
