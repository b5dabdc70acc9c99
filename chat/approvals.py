"""Always-allowed tools, kept per chat session.

"Always allow" on the approval card lets one gated tool run without asking
in the session where it was given, and nowhere else: another session, a
fork or an imported copy asks again. The chat lists and revokes the open
session's approvals; Settings lists every session's. Synchronous ORM code;
the chat socket's frames and the tool loop call it through `sync_to_async`."""
from __future__ import annotations

from django.db import IntegrityError

from chat.models import ChatSession, ToolApproval


def allowed(session_id: str) -> list[str]:
    """The tools this session runs without asking, sorted."""
    return list(ToolApproval.objects.filter(session_id=session_id).order_by("tool").values_list("tool", flat=True))


def is_allowed(session_id: str, tool: str) -> bool:
    return ToolApproval.objects.filter(session_id=session_id, tool=tool).exists()


def allow(session_id: str, tool: str) -> list[str]:
    """Remember `tool` for the session; a session deleted meanwhile keeps nothing."""
    if ChatSession.objects.filter(id=session_id).exists():
        try:
            ToolApproval.objects.get_or_create(session_id=session_id, tool=tool)
        except IntegrityError:  # deleted between the check and the insert
            pass
    return allowed(session_id)


def revoke(session_id: str, tool: str) -> bool:
    """Forget one approval; False when the session had none for `tool`."""
    removed, _ = ToolApproval.objects.filter(session_id=session_id, tool=tool).delete()
    return removed > 0


def every_session() -> list[dict]:
    """Each session holding approvals: `{session_id, title, always_allow}`, newest session first."""
    rows: dict[str, dict] = {}
    for a in ToolApproval.objects.select_related("session").order_by("-session__updated_at", "tool"):
        row = rows.setdefault(a.session_id, {"session_id": a.session_id, "title": a.session.title,
                                             "always_allow": []})
        row["always_allow"].append(a.tool)
    return list(rows.values())
