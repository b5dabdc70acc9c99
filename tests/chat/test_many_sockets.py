"""Many /ws/chat sockets at once (bench/sockets.py measures 200 against a
real server): opening costs the same whatever the number of stored chats,
every socket that asks gets its turn's end, nothing is left running or
followed afterwards, and a socket whose app daphne kills past its close
timeout leaves no follower holding its turn."""
from __future__ import annotations

import asyncio
import threading

import pytest

from tests.chat import chatws

SOCKETS = 30
SHORT_REPLY = 8  # tokens: a reply that still streams a few text frames


async def _open():
    """A socket, past its `ready` and `sessions` frames (chatws.connect, with room for 30 opening at once)."""
    from channels.testing import WebsocketCommunicator

    ws = WebsocketCommunicator(chatws.asgi_app(), "/ws/chat", headers=[(b"host", b"testserver")])
    ws.scope["client"] = list(chatws.LOOPBACK)
    connected, _ = await ws.connect(timeout=60)
    assert connected
    assert (await ws.receive_json_from(timeout=60))["type"] == "ready"
    assert (await ws.receive_json_from(timeout=60))["type"] == "sessions"
    return ws


@pytest.fixture
def queries(monkeypatch):
    """The SQL statements run on every thread (the sockets' sync calls run on asgiref's)."""
    from django.db.backends.utils import CursorWrapper

    count = [0]
    lock = threading.Lock()
    original = CursorWrapper._execute

    def counted(self, sql, params, *ignored):
        with lock:
            count[0] += 1
        return original(self, sql, params, *ignored)

    monkeypatch.setattr(CursorWrapper, "_execute", counted)
    return count


def test_opening_a_socket_reads_the_chat_list_in_one_query(engine, queries):
    """Each socket lists the chats as it opens (and as each turn ends): one
    query, not one per chat, so 30 sockets opening beside 30 chats do not
    queue 900 queries on the one thread the sockets share."""
    from chat import store

    for _ in range(SOCKETS):
        store.create()

    async def run():
        before = queries[0]
        sockets = await asyncio.gather(*(_open() for _ in range(SOCKETS)))
        ran = queries[0] - before
        for ws in sockets:
            await ws.disconnect()
        return ran

    ran = asyncio.run(run())
    assert ran <= 2 * SOCKETS, f"{SOCKETS} sockets opening ran {ran} queries"


def test_the_chat_list_is_newest_first(engine):
    """The one query keeps the list's order: the chat touched last comes first (its GROUP BY dropped the
    model's ordering, and the 200 listed were any 200)."""
    from chat import store
    from chat.models import ChatSession

    first, second = store.create(), store.create()
    first.title = "touched last"
    first.save()
    listed = [row["id"] for row in store.sessions()]
    assert listed[:2] == [first.id, second.id]
    assert listed == list(ChatSession.objects.order_by("-updated_at").values_list("id", flat=True)[:200])


def test_many_sockets_each_get_their_turn_and_leave_nothing_behind(engine):
    from dataclasses import replace

    from chat.models import ChatEntry
    from hearth.root import RUNTIME

    async def ask(i: int) -> dict:
        ws = await _open()
        frames = await chatws.turn(ws, {"type": "prompt", "text": f"hello {i}"})
        await ws.disconnect()
        return frames[-1]

    async def ask_and_leave(i: int) -> str:
        ws = await _open()
        await ws.send_json_to({"type": "prompt", "text": f"bye {i}"})
        start = await ws.receive_json_from(timeout=60)
        await ws.disconnect()
        return start["sessionId"]

    async def run():
        # Short replies for the sockets that stay (the 30 turns run side by side all the same); the sockets that
        # leave keep the fixture's TURN_TOKENS, so they leave while their turns still run.
        capped = RUNTIME.options
        RUNTIME.options = replace(capped, defaults=replace(capped.defaults, max_tokens=SHORT_REPLY))
        try:
            ends = await asyncio.gather(*(ask(i) for i in range(SOCKETS)))
        finally:
            RUNTIME.options = capped
        left = await asyncio.gather(*(ask_and_leave(i) for i in range(10)))
        for session in left:  # the turns of the sockets that left run to their end
            stream = RUNTIME.streams.get(session)
            await stream.done.wait()
        return ends

    asked_before = set(ChatEntry.objects.filter(role="user").values_list("id", flat=True))  # other tests' too
    ends = asyncio.run(run())
    assert all(end["type"] == "turn_end" for end in ends)
    stats = RUNTIME.streams.stats()
    assert stats["live"] == 0 and stats["following"] == 0
    assert engine.active_rows == 0 and engine.queued == 0
    unanswered = [q.id for q in ChatEntry.objects.filter(role="user").exclude(id__in=asked_before)
                  if not q.children.exists()]
    assert unanswered == []


def test_a_socket_killed_past_its_close_timeout_leaves_no_follower(engine, workspace, steer, approvals,
                                                                  monkeypatch):
    """daphne cancels a socket's app that is still busy its
    application_close_timeout after the close, before `disconnect` runs; the
    turn goes on (here waiting for an approval) with no one following it, so
    it is denied as unattended and ends."""
    import json

    import chat.live
    import chat.toolloop
    from chat.models import ChatEntry
    from hearth.root import RUNTIME

    steer("write", {"path": "a.txt", "content": "hi"})
    # Unattended as soon as no socket follows, asked again every 10 ms: the turn ends only once its follower is gone.
    monkeypatch.setattr(chat.live, "UNATTENDED_S", 0.0)
    monkeypatch.setattr(chat.toolloop, "ASK_POLL_S", 0.01)

    async def run():
        ws = await chatws.connect()
        await chatws.coding(ws)
        await ws.send_json_to({"type": "prompt", "text": "write it"})
        frames = await chatws.until(ws, "tool_approval_request")
        session = frames[0]["sessionId"]
        stream = RUNTIME.streams.get(session)
        assert stream.live and stream.followers == 1
        ws.future.cancel()  # what daphne does to an app that outlives application_close_timeout
        try:  # a generous bound for a busy machine; the old code never ends the turn (its follower stays)
            await asyncio.wait_for(stream.done.wait(), 120)
        finally:
            await RUNTIME.streams.stop(session)
        return session, stream.followers

    session, followers = asyncio.run(run())
    assert followers == 0
    answer = ChatEntry.objects.get(session_id=session, role="assistant")
    [call] = json.loads(answer.meta_json)["toolRounds"][0]["calls"]
    assert call["result"] == chat.toolloop.UNANSWERED  # denied as unattended, not run
    assert not (workspace / "a.txt").exists()
