"""Who may run the chat's coding tools, for how long an approval holds, and
that nothing a `bash` call starts outlives it.

- "Always allow" holds for one tool in one session: another session, on the
  same socket or a new one, is asked again; the chat and Settings revoke it.
- The coding tools are refused to a socket that is neither from loopback nor
  signed in (`scope["hearth_signed_in"]`, set by the auth layer).
- A `bash` call's processes die with its timeout, the turn's abort or the
  socket's close, including ones that called `setsid` or double-forked.

Turns run on the real engine with the tiny model, steered as in
test_chat_tools.py."""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from tests.chat import chatws

REMOTE = ("192.0.2.7", 41000)
# A new session, then a double fork: the grandchild is nobody's child in the tool's tree.
ESCAPE = f"{sys.executable} escape.py"
ESCAPE_PY = """import os, time
os.setsid()
pid = os.fork()
if pid:
    open("daemon.pid", "w").write(str(pid))
else:
    time.sleep(1000)
"""


@pytest.fixture
def escape(workspace) -> Path:
    (workspace / "escape.py").write_text(ESCAPE_PY)
    return workspace


def _pid(folder: Path, name: str) -> int:
    for _ in range(100):
        text = (folder / name).read_text() if (folder / name).exists() else ""
        if text.strip():
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"{name} was never written")


async def _prompt(ws, answer: dict | None) -> list[dict]:
    """One turn of the steered write; `answer` replies to the approval card,
    None asserts that no card came."""
    await ws.send_json_to({"type": "prompt", "text": "write it"})
    frames = await chatws.until(ws, "tool_approval_request" if answer else "tool_end")
    if answer:
        await ws.send_json_to({"type": "approval", "callId": frames[-1]["callId"], **answer})
    else:
        assert "tool_approval_request" not in chatws.kinds(frames)
    return frames + await chatws.until(ws, "turn_end")


async def _open(ws, session: str) -> dict:
    await ws.send_json_to({"type": "open_session", "path": session})
    history = await ws.receive_json_from(timeout=10)
    assert (await ws.receive_json_from())["type"] == "sessions"
    return history


def test_always_allow_holds_in_one_session(engine, workspace, steer, approvals, homes):
    from django.conf import settings

    # The old global list grants nothing.
    (settings.HEARTH_HOME / "tool-approvals.json").write_text(json.dumps({"alwaysAllow": ["write", "bash"]}))
    steer("write", {"path": "a.txt", "content": "hi"})

    async def run():
        ws = await chatws.connect()
        await chatws.coding(ws)
        frames = await _prompt(ws, {"decision": "allow", "alwaysAllow": True})
        first = next(f for f in frames if f["type"] == "turn_start")["sessionId"]
        assert next(f for f in frames if f["type"] == "tool_approvals") == {
            "type": "tool_approvals", "sessionId": first, "alwaysAllow": ["write"]}
        await _prompt(ws, None)  # the same session asks no more

        await ws.send_json_to({"type": "new_session"})
        assert (await ws.receive_json_from(timeout=10))["type"] == "history"
        await ws.receive_json_from()  # sessions
        await chatws.coding(ws)
        frames = await _prompt(ws, {"decision": "deny"})  # a new session asks again
        second = next(f for f in frames if f["type"] == "turn_start")["sessionId"]
        assert second != first
        await ws.disconnect()

        other = await chatws.connect()  # a new socket on another session asks too
        history = await _open(other, second)
        assert history["settings"]["alwaysAllow"] == [] and history["settings"]["codingTools"] is True
        await _prompt(other, {"decision": "deny"})
        history = await _open(other, first)  # and the session that allowed it still does not ask
        assert history["settings"]["alwaysAllow"] == ["write"]
        await _prompt(other, None)

        await other.send_json_to({"type": "revoke_approval", "tool": "write"})
        assert await other.receive_json_from(timeout=10) == {
            "type": "tool_approvals", "sessionId": first, "alwaysAllow": []}
        await other.send_json_to({"type": "revoke_approval", "tool": "write"})
        error = await other.receive_json_from(timeout=10)
        assert error["type"] == "error" and "not always-allowed" in error["message"]
        await other.send_json_to({"type": "revoke_approval"})
        assert (await other.receive_json_from(timeout=10))["type"] == "error"
        await _prompt(other, {"decision": "deny"})  # asked again after the revoke
        await other.disconnect()

    asyncio.run(run())
    (settings.HEARTH_HOME / "tool-approvals.json").unlink()


def test_settings_routes_list_and_revoke(django_ready, client, approvals):
    from chat import store
    from chat.models import ToolApproval

    one, two = store.create(), store.create()
    one.title, two.title = "first chat", "second chat"
    one.save(), two.save()
    for session, tool in ((one, "bash"), (one, "write"), (two, "edit")):
        ToolApproval.objects.create(session=session, tool=tool)
    route = "/api/settings/tool-approvals"

    listed = client.get(route).json()
    assert listed["ok"] is True and listed["sessions"] == [
        {"session_id": two.id, "title": "second chat", "always_allow": ["edit"]},
        {"session_id": one.id, "title": "first chat", "always_allow": ["bash", "write"]}]
    assert client.get(route, {"session_id": one.id}).json()["sessions"] == [listed["sessions"][1]]
    missing = client.get(route, {"session_id": "nope"})
    assert missing.status_code == 404 and missing.json() == {"ok": False, "error": "no session nope"}

    def delete(body, **kw):
        raw = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return client.delete(route, raw, content_type="application/json", **kw)

    for body, status in (("{not json", 400), (b"\xff", 400), ([1], 400), ({"tool": "bash"}, 400),
                         ({"session_id": one.id}, 400), ({"session_id": one.id, "tool": 3}, 400),
                         ({"session_id": "nope", "tool": "bash"}, 404), ({"session_id": two.id, "tool": "bash"}, 404)):
        answer = delete(body)
        assert answer.status_code == status, (body, answer.content)
        assert answer.json()["ok"] is False and answer.json()["error"], body
    done = delete({"session_id": one.id, "tool": "bash"})
    assert done.status_code == 200 and done.json() == {"ok": True, "session_id": one.id, "always_allow": ["write"]}
    assert ToolApproval.objects.filter(session=two).count() == 1  # the other session keeps its own
    two.delete()
    assert [s["session_id"] for s in client.get(route).json()["sessions"]] == [one.id]


def test_coding_tools_need_loopback_or_sign_in(engine, workspace, steer, approvals, monkeypatch):
    from channels.routing import URLRouter
    from django.urls import path

    import chat.turns
    from chat import store
    from chat.consumer import ChatConsumer
    from hearth.root import RUNTIME

    (workspace / "notes.txt").write_text("alpha")
    steer("read", {"path": "notes.txt"})
    offered: list[set[str]] = []  # the tool names each generation was given
    steered = chat.turns.body

    def body(session, messages, next_turn, tools=None):
        offered.append({t["function"]["name"] for t in tools or []})
        return steered(session, messages, next_turn, tools)

    monkeypatch.setattr(chat.turns, "body", body)
    stored = store.create()
    stored.coding_tools = True  # turned on earlier, from the server's own machine
    stored.save()

    async def remote_socket(ws):
        await ws.send_json_to({"type": "set_coding_tools", "enabled": True})
        error = await ws.receive_json_from(timeout=10)
        assert error["type"] == "error" and "loopback" in error["message"] and "sign in" in error["message"]
        await chatws.coding(ws, False)  # turning them off is always allowed
        history = await _open(ws, stored.id)
        assert history["settings"]["codingTools"] is False
        frames = await chatws.turn(ws, {"type": "prompt", "text": "read my notes"})
        assert not {"read", "bash", "edit", "write"} & offered[-1]
        assert not [f for f in frames if f["type"] == "tool_end" and f["ok"]]  # the markup, if parsed, ran nothing

    async def run():
        ws = await chatws.connect(client=REMOTE)
        await remote_socket(ws)
        await ws.disconnect()
        ws = await chatws.connect(client=None)  # no known peer
        await ws.send_json_to({"type": "set_coding_tools", "enabled": True})
        assert (await ws.receive_json_from(timeout=10))["type"] == "error"
        await ws.disconnect()

        # Vouched for by the auth layer: a key or a signed-in dashboard.
        app = URLRouter([path("ws/chat", ChatConsumer.as_asgi())])
        ws = await chatws.connect(client=REMOTE, app=app, hearth_signed_in=True, runtime=RUNTIME)
        await chatws.coding(ws)
        stored_history = await _open(ws, stored.id)
        assert stored_history["settings"]["codingTools"] is True
        before = len(offered)
        frames = await chatws.turn(ws, {"type": "prompt", "text": "read my notes"})
        assert {"read", "bash", "edit", "write"} <= offered[before]
        end = next(f for f in frames if f["type"] == "tool_end")
        assert end["ok"] is True and "alpha" in end["result"]
        await ws.disconnect()

    asyncio.run(run())


def test_loopback_addresses():
    from chat.consumer import coding_permitted

    for address in ("127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"):
        assert coding_permitted({"client": [address, 1]}), address
    for address in ("192.168.1.4", "10.0.0.1", "::ffff:10.0.0.1", "fe80::1", "", "localhost"):
        assert not coding_permitted({"client": [address, 1]}), address
    assert not coding_permitted({}) and not coding_permitted({"client": None})
    assert not coding_permitted({"client": ["10.0.0.1", 1], "hearth_signed_in": "yes"})
    assert coding_permitted({"client": ["10.0.0.1", 1], "hearth_signed_in": True})


# -- nothing a bash call starts outlives it -----------------------------------
def test_bash_timeout_kills_processes_that_left_the_session(escape):
    from chat.tools import CODING_TOOLS, call_sync

    command = f"setsid sleep 1000 & echo $! > setsid.pid; {ESCAPE}; sleep 30"
    started = time.monotonic()
    ok, text = call_sync(CODING_TOOLS["bash"], {"command": command, "timeout": 2})
    assert not ok and "killed after 2 s" in text and time.monotonic() - started < 20
    for name in ("setsid.pid", "daemon.pid"):
        assert chatws.gone(_pid(escape, name)), name


def test_bash_leaves_nothing_running_when_it_returns(escape):
    from chat.tools import CODING_TOOLS, call_sync

    command = f"setsid sleep 1000 > /dev/null 2>&1 & echo $! > setsid.pid; {ESCAPE}; setsid sleep 1000 & echo done"
    started = time.monotonic()
    assert call_sync(CODING_TOOLS["bash"], {"command": command}) == (True, "done\n")
    assert time.monotonic() - started < 20  # not held open by the child that kept the output pipe
    for name in ("setsid.pid", "daemon.pid"):
        assert chatws.gone(_pid(escape, name)), name


def test_a_closed_socket_leaves_the_bash_running_and_abort_kills_it(engine, escape, steer, approvals):
    """The turn outlives its socket (a reload reattaches to it); stopping the
    turn, from a socket that opened the chat again, kills the whole tree."""
    from chat import store
    from chat.models import ToolApproval

    session = store.create()
    session.coding_tools = True
    session.save()
    ToolApproval.objects.create(session=session, tool="bash")
    steer("bash", {"command": f"setsid sleep 1000 & echo $! > setsid.pid; {ESCAPE}; echo started; sleep 60"})

    async def run():
        ws = await chatws.connect()
        await _open(ws, session.id)
        await ws.send_json_to({"type": "prompt", "text": "run it"})
        frames = await chatws.until(ws, "tool_update")
        assert "tool_approval_request" not in chatws.kinds(frames)
        escaped, daemon = _pid(escape, "setsid.pid"), _pid(escape, "daemon.pid")
        assert not chatws.gone(escaped, 0.2) and not chatws.gone(daemon, 0.2)
        await ws.disconnect()
        assert not chatws.gone(escaped, 2) and not chatws.gone(daemon, 2)  # the turn goes on
        ws = await chatws.connect()
        await _open(ws, session.id)
        await ws.send_json_to({"type": "abort"})
        end = await chatws.until(ws, "turn_end")
        assert end[-1]["aborted"] is True
        assert chatws.gone(escaped) and chatws.gone(daemon)
        await ws.disconnect()

    asyncio.run(run())
