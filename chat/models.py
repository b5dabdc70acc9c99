"""Dashboard chat sessions: a tree of entries per session.

Every entry points at its parent, so an edited question or a regenerated
answer becomes a sibling branch instead of overwriting anything; the
session remembers which leaf is showing (`leaf`), and the conversation is
the path from the root to it."""
from __future__ import annotations

import uuid

from django.db import models


def _id() -> str:
    return uuid.uuid4().hex[:16]


class ChatSession(models.Model):
    id = models.CharField(primary_key=True, max_length=32, default=_id, editable=False)
    title = models.CharField(max_length=200, default="New chat")
    system_prompt = models.TextField(null=True, blank=True)
    thinking = models.BooleanField(default=False)
    adapter = models.CharField(max_length=256, null=True, blank=True)
    model = models.CharField(max_length=256, null=True, blank=True)  # router mode: its model (None: the default)
    sampling_json = models.TextField(default="{}")  # session-scoped sampling overrides
    coding_tools = models.BooleanField(default=False)  # offer the workspace tools (bash, edit, write, read)
    leaf = models.ForeignKey("ChatEntry", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-updated_at"]

    def __str__(self) -> str:
        return self.title


class ChatEntry(models.Model):
    ROLES = [(r, r) for r in ("user", "assistant")]

    id = models.CharField(primary_key=True, max_length=32, default=_id, editable=False)
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="entries")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="children")
    role = models.CharField(max_length=16, choices=ROLES)
    content = models.TextField(default="")
    reasoning = models.TextField(default="")
    meta_json = models.TextField(default="{}")  # lane, timings, usage of an assistant turn
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["session", "parent"])]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:60]}"


class ToolApproval(models.Model):
    """A gated tool the user told one chat session to run without asking.
    It holds in that session only: a new or forked session asks again, and
    deleting the session deletes it."""
    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="approvals")
    tool = models.CharField(max_length=256)  # chat.frames.MAX_ID
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tool"]
        constraints = [models.UniqueConstraint(fields=["session", "tool"], name="chat_approval_once_per_tool")]

    def __str__(self) -> str:
        return f"{self.tool} in {self.session_id}"
