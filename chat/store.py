"""Session trees in the database: the path to the showing leaf, branching,
siblings, forks. Synchronous ORM code; the chat socket's frames
(`chat/frames.py`) call it through `sync_to_async`."""
from __future__ import annotations

import json
import math

from django.db import transaction
from django.db.models import Count

from chat.models import ChatEntry, ChatSession

TITLE_CHARS = 60


def path(session: ChatSession, leaf: ChatEntry | None = None, entries: dict | None = None) -> list[ChatEntry]:
    """Entries from the root to `leaf` (the session's leaf by default)."""
    entries = entries if entries is not None else {e.id: e for e in session.entries.all()}
    node = entries.get((leaf or session.leaf).id) if (leaf or session.leaf) else None
    out = []
    while node is not None:
        out.append(node)
        node = entries.get(node.parent_id)
    return out[::-1]


def history(session: ChatSession) -> list[dict]:
    """The showing path as the dashboard draws it; one query for the whole session."""
    entries = {e.id: e for e in session.entries.all()}  # ordered by created_at
    siblings: dict[tuple, list[str]] = {}
    for e in entries.values():
        siblings.setdefault((e.parent_id, e.role), []).append(e.id)
    return [entry_row(e, siblings[(e.parent_id, e.role)]) for e in path(session, entries=entries)]


def entry_row(e: ChatEntry, siblings: list[str] | None = None) -> dict:
    if siblings is None:
        siblings = list(ChatEntry.objects.filter(session_id=e.session_id, parent_id=e.parent_id, role=e.role)
                        .order_by("created_at").values_list("id", flat=True))
    return {"id": e.id, "parentId": e.parent_id, "role": e.role, "content": e.content, "reasoning": e.reasoning,
            "meta": _meta(e.meta_json), "siblingIndex": siblings.index(e.id),
            "siblingCount": len(siblings), "siblingIds": siblings, "createdAt": e.created_at.isoformat()}


def _meta(raw: str) -> dict:
    try:
        meta = json.loads(raw or "{}")
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


def history_pages(session: ChatSession, budget: int) -> tuple[int, list[list[dict]]]:
    """`history` in pages (see `pages`), and how many rows it has."""
    items = history(session)
    return len(items), pages(items, budget)


def pages(items: list[dict], budget: int) -> list[list[dict]]:
    """History rows in pages of about `budget` bytes of JSON, so a chat of
    any size opens without one frame over the socket's limit. A row too
    large for a page is split into parts: the first carries the row with the
    start of its text, and each later part is `{"id", "continued": true}`
    with more `content` and `reasoning` to append, a tool round to add
    (`meta.toolRounds`), or, for a round too large itself, one more of its
    calls (`meta.roundCalls`). A single call too large for a page is shown
    cut short (the stored entry keeps it whole)."""
    out: list[list[dict]] = [[]]
    used = 0
    for item in items:
        for part in _parts(item, budget):
            size = _size(part)
            if out[-1] and used + size > budget:
                out.append([])
                used = 0
            out[-1].append(part)
            used += size
    return out


def _size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _parts(item: dict, budget: int) -> list[dict]:
    if _size(item) <= budget:
        return [item]
    chunk = max(budget // 16, 1)  # characters: at most 6 bytes each as JSON, content and reasoning side by side
    meta = item.get("meta") or {}
    rounds = meta.get("toolRounds") or []
    content, reasoning = item.get("content") or "", item.get("reasoning") or ""
    out = [dict(item, content=content[:chunk], reasoning=reasoning[:chunk],
                meta={**meta, "toolRounds": []} if rounds else meta)]
    for offset in range(chunk, max(len(content), len(reasoning)), chunk):
        out.append({"id": item["id"], "continued": True, "content": content[offset:offset + chunk],
                    "reasoning": reasoning[offset:offset + chunk]})
    for r in rounds:
        part = {"id": item["id"], "continued": True, "meta": {"toolRounds": [r]}}
        if _size(part) <= budget:
            out.append(part)
            continue
        calls = r.get("calls") or []
        out.append({"id": item["id"], "continued": True,
                    "meta": {"toolRounds": [{**r, "text": _cut(r.get("text") or "", chunk), "calls": []}]}})
        out += [{"id": item["id"], "continued": True, "meta": {"roundCalls": [_shown(call, budget, chunk)]}}
                for call in calls]
    return out


def _shown(call: dict, budget: int, chunk: int) -> dict:
    if _size(call) <= budget:
        return call
    args = call.get("args")
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {**call, "args": _cut(text, chunk), "result": _cut(str(call.get("result") or ""), chunk)}


def _cut(text: str, chunk: int) -> str:
    if len(text) <= chunk:
        return text
    return text[:chunk] + f"\n… [{len(text) - chunk} more characters, kept in the chat but not shown here]"


def sessions() -> list[dict]:
    """The 200 newest chats, in one query (every socket reads this as it opens and as each turn ends)."""
    # Ordered here: a GROUP BY query leaves the model's Meta.ordering out (the list came in no order).
    rows = (ChatSession.objects.annotate(entry_count=Count("entries")).only("id", "title", "updated_at")
            .order_by("-updated_at")[:200])
    return [{"path": s.id, "id": s.id, "title": s.title, "updatedAt": s.updated_at.isoformat(),
             "messageCount": s.entry_count} for s in rows]


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


def ask(session: ChatSession, text: str, images: list[str] | None = None) -> ChatEntry:
    """A new question after the leaf on show, with its attached pictures
    (data: URLs, kept in its meta). A question left unanswered (its turn
    stopped at once, or failed: its answer is only the error) is not
    followed by another question: the new one becomes its sibling, so the
    model reads roles that alternate."""
    leaf = session.leaf
    meta = {"images": images} if images else None
    if leaf is not None and only_an_error(leaf) and leaf.parent is not None:
        return add(session, leaf.parent.parent, "user", text, meta=meta)
    if leaf is not None and leaf.role == "user" and not leaf.children.exists():
        return add(session, leaf.parent, "user", text, meta=meta)
    return add(session, leaf, "user", text, meta=meta)


def only_an_error(entry: ChatEntry) -> bool:
    """An answer that is only why its turn failed: nothing the model wrote, so
    no answer for a new question to follow (`ask` makes it a sibling of the
    question that failed)."""
    if entry.role != "assistant" or entry.content:
        return False
    meta = _meta(entry.meta_json)
    return bool(meta.get("error")) and not meta.get("toolRounds")


def images_of(entry: ChatEntry) -> list[str]:
    """The pictures attached to a question (data: URLs)."""
    images = _meta(entry.meta_json).get("images")
    return [url for url in images if isinstance(url, str)] if isinstance(images, list) else []


def user_content(entry: ChatEntry) -> str | list[dict]:
    """A question as the model reads it: its text, after its pictures as image parts."""
    images = images_of(entry)
    if not images:
        return entry.content
    return [*({"type": "image_url", "image_url": {"url": url}} for url in images),
            {"type": "text", "text": entry.content}]


def stored_sampling(session: ChatSession) -> dict:
    """The session's saved sampling values; anything that is not a finite
    number (a NaN saved before values were checked) is left out, but for
    the checked generation settings of `chat.gensettings`."""
    try:
        saved = json.loads(session.sampling_json or "{}")
    except ValueError:
        return {}
    if not isinstance(saved, dict):
        return {}
    from chat import gensettings

    numbers = {k: v for k, v in saved.items() if k not in gensettings.KEYS and isinstance(v, (int, float))
               and not isinstance(v, bool) and math.isfinite(v)}
    return {**numbers, **gensettings.stored(saved)}


def settings(session: ChatSession) -> dict:
    return {"thinking": session.thinking, "systemPrompt": session.system_prompt, "adapter": session.adapter,
            "model": session.model,
            "codingTools": session.coding_tools, "sampling": stored_sampling(session)}


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
