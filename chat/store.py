"""Session trees in the database: the path to the showing leaf, branching,
siblings, forks. Synchronous ORM code; the WebSocket consumer calls it
through `sync_to_async`."""
from __future__ import annotations

import json

from django.db import transaction

from chat.models import ChatEntry, ChatSession

TITLE_CHARS = 60


def path(session: ChatSession, leaf: ChatEntry | None = None) -> list[ChatEntry]:
    """Entries from the root to `leaf` (the session's leaf by default)."""
    entries = {e.id: e for e in session.entries.all()}
    node = entries.get((leaf or session.leaf).id) if (leaf or session.leaf) else None
    out = []
    while node is not None:
        out.append(node)
        node = entries.get(node.parent_id)
    return out[::-1]


def history(session: ChatSession) -> list[dict]:
    return [entry_row(e) for e in path(session)]


def entry_row(e: ChatEntry) -> dict:
    siblings = list(ChatEntry.objects.filter(session_id=e.session_id, parent_id=e.parent_id, role=e.role)
                    .order_by("created_at").values_list("id", flat=True))
    return {"id": e.id, "parentId": e.parent_id, "role": e.role, "content": e.content, "reasoning": e.reasoning,
            "meta": json.loads(e.meta_json or "{}"), "siblingIndex": siblings.index(e.id),
            "siblingCount": len(siblings), "siblingIds": siblings, "createdAt": e.created_at.isoformat()}


def sessions() -> list[dict]:
    return [{"path": s.id, "id": s.id, "title": s.title, "updatedAt": s.updated_at.isoformat(),
             "messageCount": s.entries.count()} for s in ChatSession.objects.all()[:200]]


def create(system_prompt: str | None = None) -> ChatSession:
    return ChatSession.objects.create(system_prompt=system_prompt)


def add(session: ChatSession, parent: ChatEntry | None, role: str, content: str, reasoning: str = "",
        meta: dict | None = None) -> ChatEntry:
    with transaction.atomic():
        entry = ChatEntry.objects.create(session=session, parent=parent, role=role, content=content,
                                         reasoning=reasoning, meta_json=json.dumps(meta or {}))
        session.leaf = entry
        fields = ["leaf", "updated_at"]
        if role == "user" and parent is None and session.title == "New chat":
            session.title = " ".join(content.split())[:TITLE_CHARS] or "New chat"
            fields.append("title")
        session.save(update_fields=fields)  # never overwrite settings another tab just changed
    return entry


def ask(session: ChatSession, text: str) -> ChatEntry:
    """A new question after the leaf on show. A question left unanswered (its
    turn failed or was stopped at once) is not followed by another question:
    the new one becomes its sibling, so roles keep alternating."""
    leaf = session.leaf
    if leaf is not None and leaf.role == "user" and not leaf.children.exists():
        return add(session, leaf.parent, "user", text)
    return add(session, leaf, "user", text)


def settings(session: ChatSession) -> dict:
    return {"thinking": session.thinking, "systemPrompt": session.system_prompt, "adapter": session.adapter,
            "codingTools": session.coding_tools, "sampling": json.loads(session.sampling_json or "{}")}


def deepest(entry: ChatEntry) -> ChatEntry:
    """Follow the newest child down to a leaf."""
    node = entry
    while True:
        child = node.children.order_by("-created_at").first()
        if child is None:
            return node
        node = child


def siblings(entry: ChatEntry) -> dict:
    ids = list(ChatEntry.objects.filter(session_id=entry.session_id, parent_id=entry.parent_id, role=entry.role)
               .order_by("created_at").values_list("id", flat=True))
    return {"entryId": entry.id, "index": ids.index(entry.id), "count": len(ids), "siblingIds": ids}


def switch(session: ChatSession, entry_id: str) -> ChatEntry:
    entry = session.entries.get(id=entry_id)
    session.leaf = deepest(entry)
    session.save(update_fields=["leaf", "updated_at"])
    return entry


def fork(session: ChatSession) -> ChatSession:
    """A new session holding a copy of the showing path."""
    with transaction.atomic():
        copy = ChatSession.objects.create(title=f"{session.title} (fork)"[:200], system_prompt=session.system_prompt,
                                          thinking=session.thinking, adapter=session.adapter,
                                          coding_tools=session.coding_tools,
                                          sampling_json=session.sampling_json, forked_from=session)
        parent = None
        for e in path(session):
            parent = ChatEntry.objects.create(session=copy, parent=parent, role=e.role, content=e.content,
                                              reasoning=e.reasoning, meta_json=e.meta_json)
        copy.leaf = parent
        copy.save()
    return copy
