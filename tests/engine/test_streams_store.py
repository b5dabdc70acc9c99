"""The resumable-stream store on its own (no server): the per-stream cap
drops whole events from the head, the total cap drops finished streams
oldest first and then, as live ones grow, their oldest events, the TTL
forgets them, and a stream whose process died mid-event is cut at its last
whole event and ended with its crash event."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from core import sse
from serving.streams.disk import Owner
from serving.streams.log import Gone
from serving.streams.store import CRASH_MESSAGE as CRASH
from serving.streams.store import StreamRefused, Streams, close_quietly


async def _events(n: int, size: int = 40):
    for i in range(n):
        yield sse.frame({"i": i, "pad": "x" * size})


async def _stop() -> None:
    return None


def _error(message: str) -> bytes:
    return sse.frame({"error": {"message": message}})


async def _run(store: Streams, conv: str, n: int, size: int = 40) -> bytes:
    """Run a stream of n events to its end; answer every byte it was sent."""
    await store.start(conv, "openai", "m", _events(n, size), _stop, _error)
    await store.get(conv).done.wait()
    return b"".join([chunk async for chunk in _events(n, size)])


def test_the_per_stream_cap_keeps_the_tail_from_an_event_boundary(tmp_path):
    async def scenario():
        store = Streams(tmp_path, cap=2000)
        store.open()
        whole = await _run(store, "c", 200)  # about 12 kB through a 2 kB cap
        stream = store.get("c")
        assert stream.end == len(whole) and 0 < stream.start < stream.end
        assert stream.end - stream.start <= 2000
        with pytest.raises(Gone):
            stream.check_offset(0)
        tail = b"".join([c async for c in stream.follow(stream.start)])
        assert tail == whole[stream.start:] and tail.startswith(b"data: ")  # whole events only
        store.shutdown()  # writes everything out
        return whole, stream.start

    whole, start = asyncio.run(scenario())

    async def after_restart():
        store = Streams(tmp_path, cap=2000)
        store.open()
        stream = store.get("c")
        assert (stream.start, stream.end, stream.meta.state) == (start, len(whole), "done")
        replay = b"".join([c async for c in store.get("c").follow(start)])
        store.shutdown()
        return replay

    assert asyncio.run(after_restart()) == whole[start:]


def test_the_total_cap_drops_finished_streams_oldest_first(tmp_path):
    async def scenario():
        store = Streams(tmp_path, cap=1000, total=2200)
        store.open()
        for conv in ("a", "b", "c"):
            await _run(store, conv, 10)  # ~700 bytes each
            await asyncio.sleep(0.01)
        assert store.get("a") is None and store.get("b") is not None and store.get("c") is not None
        assert store.stats()["bytes"] <= 2200 and store.stats()["stored"] == 2
        store.shutdown()

    asyncio.run(scenario())
    assert {p.stem for p in tmp_path.glob("*.json")} and len(list(tmp_path.glob("*.sse"))) == 2


def test_live_streams_alone_over_the_total_refuse_a_new_one(tmp_path):
    async def forever():
        yield sse.frame({"hold": "x" * 900})
        await asyncio.sleep(3600)

    async def scenario():
        store = Streams(None, cap=1000, total=1500)
        await store.start("a", "openai", "m", forever(), _stop, _error)
        await asyncio.sleep(0.01)  # its first event is in
        with pytest.raises(StreamRefused) as refused:
            await store.start("b", "openai", "m", forever(), _stop, _error)
        assert refused.value.status == 503
        store.shutdown()

    asyncio.run(scenario())


def test_live_streams_growing_past_the_total_drop_finished_then_their_own_oldest_events(tmp_path):
    """Three streams start while the store is nearly empty and each grows
    to almost its own cap: together they would pass the total. Finished
    streams go first, then the growing streams' oldest events; a reader
    that keeps up still gets every byte of its stream, and a resume from a
    dropped byte says why it is gone."""
    go, peak = asyncio.Event(), [0]

    async def growing(store: Streams, name: str):
        for i in range(15):  # about 900 bytes in all, under the 1000-byte cap of each
            peak[0] = max(peak[0], store._bytes())  # the previous event is in, and the total was kept
            yield sse.frame({"s": name, "i": i, "pad": "x" * 30})
            if i == 0:
                await go.wait()
            await asyncio.sleep(0)
        peak[0] = max(peak[0], store._bytes())

    async def scenario():
        store = Streams(tmp_path, cap=1000, total=2500)
        store.open()
        await _run(store, "old", 10)  # finished, about 650 bytes
        readers = {}
        for name in ("a", "b", "c"):
            reply = await store.start(name, "openai", "m", growing(store, name), _stop, _error)
            if name == "a":
                readers[name] = asyncio.ensure_future(_collect(reply))
            else:
                await close_quietly(reply)  # the client left: its stream goes on
        await asyncio.sleep(0.05)  # every stream has its first event in
        go.set()
        for name in ("a", "b", "c"):
            await store.get(name).done.wait()
        got = await readers["a"]
        whole = b"".join([sse.frame({"s": "a", "i": i, "pad": "x" * 30}) for i in range(15)])
        trimmed = [store.get(n) for n in ("b", "c") if store.get(n).start > 0]
        final = store._bytes()
        store.shutdown()
        return got, whole, trimmed, final

    got, whole, trimmed, final = asyncio.run(scenario())
    assert peak[0] <= 2500 and final <= 2500, peak
    assert got == whole  # the reader that kept up lost nothing
    assert trimmed, "a live stream past the total kept its oldest events"
    with pytest.raises(Gone, match="--streams-max-bytes"):
        trimmed[0].check_offset(0)


async def _collect(chunks) -> bytes:
    return b"".join([chunk async for chunk in chunks])


def test_streams_are_forgotten_after_their_ttl(tmp_path):
    async def scenario():
        store = Streams(tmp_path, ttl_s=0.2)
        store.open()
        await _run(store, "c", 3)
        assert (await store.lookup(["c"]))[0]["status"] == "done"
        store.writer.flush_all()
        await asyncio.sleep(0.3)
        assert store.get("c") is None and await store.lookup(["c"]) == []
        store.collect()
        assert not list(tmp_path.glob("*.sse"))
        store.shutdown()

    asyncio.run(scenario())


def test_a_dead_processes_stream_is_cut_at_its_last_event_and_ended(tmp_path):
    owner = Owner(tmp_path)  # a process that is about to die
    events = sse.frame({"i": 1}) + sse.frame({"i": 2})
    (tmp_path / "s1.sse").write_bytes(events + b'data: {"i": 3')  # torn mid-event
    meta = {"sid": "s1", "conversation_id": "c", "kind": "openai", "model": "m", "created": time.time(),
            "owner": owner.name, "on_crash": _error("it died").decode(), "state": "live", "ended_at": None,
            "start": 0, "end": 0}
    (tmp_path / "s1.json").write_text(json.dumps(meta))
    busy = Streams(tmp_path)
    busy.open()
    assert busy.get("c") is None  # its owner still holds its lock: not this process's to end
    busy.shutdown()
    owner.close()

    async def scenario():
        store = Streams(tmp_path)
        store.open()
        row = (await store.lookup(["c"]))[0]
        replay = b"".join([c async for c in store.get("c").follow(0)])
        store.shutdown()
        return row, replay

    row, replay = asyncio.run(scenario())
    assert row["status"] == "interrupted"
    assert replay == events + _error("it died")


def test_a_redis_that_is_away_never_fails_a_generation(tmp_path):
    """With Redis unreachable the stream runs, ends and is found as on one node."""
    from serving.streams.shared import Shared

    async def scenario():
        store = Streams(tmp_path)
        store.open()
        store.shared = Shared("redis://127.0.0.1:1/0", store.owner.name, ttl_s=60, cap=store.cap)
        whole = await _run(store, "c", 5)
        stream = await store.find("c")
        assert stream is store.get("c") and stream.meta.state == "done"
        assert b"".join([c async for c in stream.follow(0)]) == whole
        assert (await store.lookup(["c"]))[0]["status"] == "done"
        await store.stop("c")
        store.shutdown()

    asyncio.run(scenario())


def test_another_node_reads_the_capped_tail_from_redis_byte_for_byte(tmp_path, redis_url):
    """The ring in Redis keeps what the node keeps: a read from its start on
    another node gets the same bytes; one from before it is refused."""
    import redis

    from serving.streams.shared import RemoteStream, Shared

    redis.Redis.from_url(redis_url).delete(*[f"hearth:streams:conv:{c}" for c in ("capped",)])

    async def scenario():
        store = Streams(tmp_path / "a", cap=2000)
        store.open()
        store.shared = Shared(redis_url, store.owner.name, ttl_s=60, cap=2000)
        await _run(store, "capped", 200)  # about 12 kB through a 2 kB cap
        local = store.get("capped")
        other = Shared(redis_url, "another-node", ttl_s=60, cap=2000)
        sid, meta, _ = await other.find("capped")
        remote = RemoteStream(other, meta, {})
        assert sid == local.sid and (remote.start, remote.end, remote.meta.state) == (local.start, local.end, "done")
        theirs = b"".join([c async for c in remote.follow(remote.start)])
        ours = b"".join([c async for c in local.follow(local.start)])
        assert theirs == ours and theirs.startswith(b"data: ")
        middle = local.start + 333
        assert b"".join([c async for c in remote.follow(middle)]) == ours[333:]
        with pytest.raises(Gone):
            remote.check_offset(remote.start - 1)
        store.shutdown()
        await other.redis.aclose()
        await store.shared.redis.aclose()

    asyncio.run(scenario())



def test_redis_catches_up_missed_writes_and_a_node_taken_for_dead_stops_writing(redis_url):
    """Bytes a write missed go with the next one; once another node has ended
    a stream (its owner's heartbeat lapsed), the owner's writes change nothing."""
    from serving.streams.log import Meta, Stream
    from serving.streams.shared import RemoteStream, Shared

    async def scenario():
        owner = Shared(redis_url, "slow-node", ttl_s=60, cap=1 << 20)  # never beats: it looks dead
        meta = Meta(sid="catch-up", conversation_id="catch-up-c", kind="openai", model="m", created=time.time(),
                    owner="slow-node", on_crash=_error("gone").decode())
        stream = Stream(meta, None, 1 << 20)
        await owner.begin(stream)
        stream.append(sse.frame({"i": 1}))  # this write never reached Redis...
        stream.append(sse.frame({"i": 2}))
        await owner.sync(stream)  # ...and goes with this one
        reader = Shared(redis_url, "reader", ttl_s=60, cap=1 << 20)
        sid, found, _ = await reader.find("catch-up-c")  # the owner has no heartbeat: ended here
        assert found.state == "interrupted"
        replay = b"".join([c async for c in RemoteStream(reader, found, {}).follow(0)])
        assert replay == sse.frame({"i": 1}) + sse.frame({"i": 2}) + _error("gone")
        stream.append(sse.frame({"i": 3}))  # the owner was only slow: what it writes now is refused
        await owner.sync(stream)
        stream.finish("done")
        await owner.sync(stream, final=True)
        again = (await reader.find("catch-up-c"))[1]
        assert (again.state, again.end) == ("interrupted", len(replay))
        for shared in (owner, reader):
            await shared.redis.aclose()

    asyncio.run(scenario())


def test_two_nodes_starting_one_conversation_at_once_leave_one_running(tmp_path, redis_url):
    """Both nodes look for a live stream, find none and begin theirs in the
    same instant: the one Redis records second stops the other (through its
    node), as a second start on one node stops the first."""
    from serving.streams.shared import Shared

    async def endless(stopped: asyncio.Event):
        i = 0
        while not stopped.is_set():
            yield sse.frame({"i": i})
            i += 1
            await asyncio.sleep(0.01)

    async def scenario():
        nodes = []
        for name in ("a", "b"):
            store = Streams(tmp_path / name)
            store.open()
            store.shared = Shared(redis_url, store.owner.name, ttl_s=60, cap=store.cap)
            nodes.append(store)
        stops = []

        async def start(store):
            stopped = asyncio.Event()

            async def stop():
                stops.append(store)
                stopped.set()
            return await store.start("at-once", "openai", "m", endless(stopped), stop, _error)
        await asyncio.gather(*(start(store) for store in nodes))  # neither sees the other's stream yet
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and all(s.get("at-once").live for s in nodes):
            await asyncio.sleep(0.05)
        live = [s for s in nodes if s.get("at-once").live]
        assert len(live) == 1 and stops == [s for s in nodes if s not in live]
        sid, meta, _ = await nodes[0].shared.find("at-once")
        assert sid == live[0].get("at-once").sid and meta.state == "live"  # the one still running is the latest
        await live[0].stop("at-once")
        for store in nodes:
            store.shutdown()
            await store.shared.redis.aclose()

    asyncio.run(scenario())


def test_a_stream_that_ends_on_its_error_event_failed_and_is_not_replayed(tmp_path):
    """Each protocol's stream ends with its error event when the generation
    fails; such a stream is `failed`, and an identical retry generates again."""
    from core.surfaces import ANTHROPIC, OPENAI, RESPONSES

    async def ending(*frames: bytes):
        for frame in frames:
            yield frame

    async def scenario():
        store = Streams(tmp_path)
        store.open()
        cases = {"openai": (OPENAI, sse.frame({"choices": []})), "anthropic": (ANTHROPIC, sse.frame({}, "ping")),
                 "responses": (RESPONSES, sse.frame({"type": "response.created"}, "response.created"))}
        for kind, (surface, first) in cases.items():
            for conv, frames, state in ((f"{kind}-ok", [first], "done"),
                                        (f"{kind}-bad", [first, surface.stream_error("out of memory")], "failed")):
                await store.start(conv, kind, "m", ending(*frames), _stop, surface.stream_error, request="k")
                await store.get(conv).done.wait()
                assert store.get(conv).meta.state == state, (conv, state)
                found = await store.replayable(conv, "", lambda: "k")
                assert (found is not None) == (state == "done"), conv
                assert await store.replayable(conv, "", lambda: "other body") is None
        store.shutdown()

    asyncio.run(scenario())


def _numbered(i: int) -> bytes:
    kind = "response.output_text.delta"
    return sse.frame({"type": kind, "sequence_number": i, "item_id": "m", "delta": f'"sequence_number": {i + 50}'},
                     kind)


def _numbers(raw: bytes) -> list:
    return [json.loads(block.split(b"data: ", 1)[1]).get("sequence_number")
            for block in raw.split(b"\n\n") if b"data: " in block]


def test_a_responses_streams_error_event_takes_the_next_sequence_number(tmp_path):
    """However a Responses stream ends on an error event of the store's (its
    process died and a restart ends it, the server stops under it, its
    producer fails), that event carries the number after the last one sent."""
    from core.surfaces import RESPONSES
    from serving.streams.store import CRASH_MESSAGE

    owner = Owner(tmp_path)  # a process that is about to die
    kept = b"".join(_numbered(i) for i in range(4))
    (tmp_path / "s1.sse").write_bytes(kept + _numbered(4)[:-20])  # torn in event 4, after its number
    meta = {"sid": "s1", "conversation_id": "died", "kind": "responses", "model": "m", "created": time.time(),
            "owner": owner.name, "on_crash": RESPONSES.stream_error(CRASH_MESSAGE).decode(), "state": "live",
            "ended_at": None, "start": 0, "end": 0}
    (tmp_path / "s1.json").write_text(json.dumps(meta))
    owner.close()

    async def hanging():
        for i in range(3):
            yield _numbered(i)
        await asyncio.sleep(3600)

    async def failing():
        yield _numbered(0) + _numbered(1)
        raise RuntimeError("boom")

    async def scenario():
        store = Streams(tmp_path)
        store.open()
        died = b"".join([c async for c in store.get("died").follow(0)])
        await store.start("failing", "responses", "m", failing(), _stop, RESPONSES.stream_error)
        await store.get("failing").done.wait()
        failed = b"".join([c async for c in store.get("failing").follow(0)])
        await store.start("stopping", "responses", "m", hanging(), _stop, RESPONSES.stream_error)
        await asyncio.sleep(0.05)
        store.shutdown()
        stopped = b"".join([c async for c in store.get("stopping").follow(0)])
        return died, failed, stopped

    died, failed, stopped = asyncio.run(scenario())
    assert died.startswith(kept) and _numbers(died) == [0, 1, 2, 3, 4]
    assert b"server stopped before" in died.rsplit(b"\n\n", 2)[-2]
    assert _numbers(failed) == [0, 1, 2] and b"boom" in failed
    assert _numbers(stopped) == [0, 1, 2, 3] and b"server stopped before" in stopped


def test_a_stream_is_on_disk_before_its_first_byte_goes_out(tmp_path):
    """A stream's record is written as it begins, not by the writer's next
    flush: a process that dies the moment its client got the first bytes
    leaves a stream that a restart ends with its crash event."""
    import shutil

    async def slow():
        yield sse.frame({"i": 0})
        await asyncio.sleep(3600)

    async def scenario():
        store = Streams(tmp_path / "a")
        store.open()
        frames = await store.start("c", "openai", "m", slow(), _stop, _error)
        first = await frames.__anext__()
        shutil.copytree(tmp_path / "a", tmp_path / "b", ignore=shutil.ignore_patterns("owners"))  # the disk now
        store.shutdown()
        again = Streams(tmp_path / "b")  # the disk as a process that died then left it
        again.open()
        row = (await again.lookup(["c"]))[0]
        replay = b"".join([c async for c in again.get("c").follow(0)])
        again.shutdown()
        return first, row, replay

    first, row, replay = asyncio.run(scenario())
    assert first == sse.frame({"i": 0})
    # The first event too if the writer's flush got it there before the copy: the crash event ends either.
    assert row["status"] == "interrupted" and replay in (_error(CRASH), first + _error(CRASH))


def test_a_streams_files_are_written_off_the_event_loop(tmp_path, monkeypatch):
    """The record written as a stream begins, and every write behind it, are
    the writer thread's: the event loop that serves every request never
    waits on the disk (only shutdown, which flushes what is left, writes
    from the thread that stops the server)."""
    import threading

    from serving.streams import disk

    writes: list[tuple[str, int]] = []
    real = disk.write_atomically

    def spy(path, data, *args, **kwargs):
        writes.append((Path(path).suffix, threading.get_ident()))
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(disk, "write_atomically", spy)

    async def scenario():
        store = Streams(tmp_path)
        store.open()
        loop_thread = threading.get_ident()
        frames = await store.start("c", "openai", "m", _events(3), _stop, _error)
        replay = b"".join([c async for c in frames])
        stream = store.get("c")
        await stream.done.wait()
        for _ in range(500):  # the writer's flush behind the stream's end
            if json.loads(stream.path(".json").read_text())["state"] == "done":
                break
            await asyncio.sleep(0.02)
        assert json.loads(stream.path(".json").read_text())["state"] == "done"
        behind = list(writes)
        store.shutdown()
        return loop_thread, behind, replay

    loop_thread, behind, replay = asyncio.run(scenario())
    assert any(suffix == ".json" for suffix, _ in behind)
    assert all(thread != loop_thread for _, thread in behind)
    assert replay == b"".join(sse.frame({"i": i, "pad": "x" * 40}) for i in range(3))


def test_a_crashed_streams_replay_from_its_end_is_empty(tmp_path):
    """After its crash event a stream has nothing more: a replay from its
    end answers nothing (as any stream's would); from inside that event, or
    from bytes the disk never got, it answers the event alone."""
    owner = Owner(tmp_path)
    events = sse.frame({"i": 1}) + sse.frame({"i": 2})
    (tmp_path / "s1.sse").write_bytes(events)
    meta = {"sid": "s1", "conversation_id": "c", "kind": "openai", "model": "m", "created": time.time(),
            "owner": owner.name, "on_crash": _error("it died").decode(), "state": "live", "ended_at": None,
            "start": 0, "end": 0}
    (tmp_path / "s1.json").write_text(json.dumps(meta))
    owner.close()

    async def scenario():
        store = Streams(tmp_path)
        store.open()
        stream = store.get("c")
        stream.check_offset(stream.end)
        at_end = b"".join([c async for c in stream.follow(stream.end)])
        answers = [stream.after_crash(at) for at in (len(events), stream.end - 1, stream.end, stream.end + 500)]
        store.shutdown()
        return stream.end, at_end, answers

    end, at_end, answers = asyncio.run(scenario())
    assert end == len(events + _error("it died")) and at_end == b""
    assert answers == [None, b"\n\n" + _error("it died"), None, b"\n\n" + _error("it died")]


def test_a_dead_nodes_responses_stream_in_redis_ends_on_the_next_sequence_number(redis_url):
    """A reader that ends another node's orphaned stream in Redis numbers
    its crash event after the last event Redis holds, and keeps that event
    as the stream's `on_crash`: a replay from its end answers nothing."""
    from core.surfaces import RESPONSES
    from serving.streams.log import Meta, Stream
    from serving.streams.shared import RemoteStream, Shared
    from serving.streams.store import CRASH_MESSAGE

    async def scenario():
        owner = Shared(redis_url, "dead-node", ttl_s=60, cap=1 << 20)  # never beats: it looks dead
        meta = Meta(sid="numbered", conversation_id="numbered-c", kind="responses", model="m",
                    created=time.time(), owner="dead-node", on_crash=RESPONSES.stream_error(CRASH_MESSAGE).decode())
        stream = Stream(meta, None, 1 << 20)
        await owner.begin(stream)
        for i in range(12):
            stream.append(_numbered(i))
            await owner.sync(stream)
        reader = Shared(redis_url, "reader", ttl_s=60, cap=1 << 20)
        _, found, _ = await reader.find("numbered-c")
        remote = RemoteStream(reader, found, {})
        replay = b"".join([c async for c in remote.follow(0)])
        at_end = remote.after_crash(remote.end)
        for shared in (owner, reader):
            await shared.redis.aclose()
        return found, replay, at_end

    found, replay, at_end = asyncio.run(scenario())
    assert found.state == "interrupted" and _numbers(replay) == list(range(13)) and b"server stopped" in replay
    assert replay.endswith(found.on_crash.encode())
    assert at_end is None


def _slow_record(store: Streams, seconds: float) -> None:
    """The record a stream begins with takes `seconds` to reach the disk (a busy disk)."""
    import concurrent.futures
    import threading

    assert store.writer is not None
    real = store.writer.now

    def now(stream):
        done: concurrent.futures.Future = concurrent.futures.Future()
        threading.Timer(seconds, lambda: done.set_result(real(stream).result())).start()
        return done

    store.writer.now = now  # type: ignore[method-assign]


def test_a_reader_that_leaves_while_the_record_is_written_leaves_the_stream_running(tmp_path):
    """What a resumable stream is for: its generation runs to its end whatever
    its reader does, from the moment it begins, also while its record is
    still on its way to the disk."""
    async def scenario():
        store = Streams(tmp_path)
        store.open()
        _slow_record(store, 0.3)
        ran: list[int] = []

        async def events():
            async for frame in _events(3):
                ran.append(1)
                yield frame

        starting = asyncio.ensure_future(store.start("c", "openai", "m", events(), _stop, _error))
        await asyncio.sleep(0.05)
        starting.cancel()  # the client left before a byte came (its request cancelled)
        await asyncio.wait({starting})
        stream = store.get("c")
        await asyncio.wait_for(stream.done.wait(), 10)
        state = stream.meta.state
        store.shutdown()
        return state, len(ran)

    assert asyncio.run(scenario()) == ("done", 3)


def test_a_stream_the_shutdown_ends_before_its_record_is_written_stops_its_generation(tmp_path):
    """Its generator never starts, so nothing in it would stop the engine's
    work: the stream's stop is called instead."""
    async def scenario():
        store = Streams(tmp_path)
        store.open()
        _slow_record(store, 0.3)
        stopped: list[bool] = []
        ran: list[int] = []

        async def stop() -> None:
            stopped.append(True)

        async def events():
            async for frame in _events(3):
                ran.append(1)
                yield frame

        await store.start("c", "openai", "m", events(), stop, _error)
        stream = store.get("c")
        store.shutdown()  # ends every live stream, this one with its crash event
        assert stream.task is not None
        await asyncio.wait({stream.task}, timeout=10)
        return stream.live, stopped, ran

    live, stopped, ran = asyncio.run(scenario())
    assert live is False and stopped == [True] and ran == []
