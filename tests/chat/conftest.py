"""Fixtures of the /ws/chat tests: Django and the engine on the tiny model in
this process, the chat's workspace, a steered model and clean approvals."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.chat.chatws import forced, markup
from tests.helpers import TURN_TOKENS


@pytest.fixture(scope="module")
def django_ready():
    """Django in this process, on the session's real SQLite database."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


@pytest.fixture(scope="module")
def client(django_ready):
    from django.test import Client

    return Client()


@pytest.fixture(scope="module")
def engine(local_engine, django_ready):
    """The engine, with replies capped at TURN_TOKENS (tests/helpers.py)
    unless a session says otherwise."""
    from dataclasses import replace

    from hearth.root import RUNTIME

    before = RUNTIME.options
    RUNTIME.options = replace(before, defaults=replace(before.defaults, max_tokens=TURN_TOKENS))
    try:
        yield local_engine
    finally:
        RUNTIME.options = before


@pytest.fixture
def workspace(tmp_path, monkeypatch, django_ready) -> Path:
    from django.conf import settings

    root = tmp_path / "ws"
    root.mkdir()
    monkeypatch.setattr(settings, "CHAT_WORKSPACE", root)  # HEARTH_CHAT_WORKSPACE, read at start
    return root


@pytest.fixture
def steer(monkeypatch):
    """`steer(name, args)`: each turn calls that tool until a tool result
    comes back, then answers "Done.". Returns the messages of every round."""
    import chat.turns

    seen: list[list[dict]] = []
    original = chat.turns.body

    def setup(name: str, args: dict, always: bool = False):
        def body(session, messages, next_turn, tools=None):
            seen.append(list(messages))
            out = original(session, messages, next_turn, tools)
            done = messages[-1]["role"] == "tool" and not always
            out["guided_grammar"] = forced("Done." if done else markup(name, args))
            out["max_tokens"] = 200
            return out

        monkeypatch.setattr(chat.turns, "body", body)
        return seen

    return setup


@pytest.fixture
def approvals(django_ready):
    from chat.models import ToolApproval

    ToolApproval.objects.all().delete()
    yield
    ToolApproval.objects.all().delete()
