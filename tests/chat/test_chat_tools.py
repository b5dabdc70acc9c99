"""Tools in the /ws/chat turn, against the real engine on the tiny model.

The random model is steered with a grammar: while the conversation does
not end in a tool result it must write exact tool-call markup, after one it
must write "Done." So every turn here runs the real loop: parse the call,
ask for approval, run the tool, feed the result back, generate again."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from tests.chat import chatws

# The in-process engine and Django fixtures of the chat socket's tests.


def test_ungated_tool_round_trip_is_stored_and_replayed(engine, workspace, steer):
    (workspace / "notes.txt").write_text("alpha\nbeta\n")
    seen = steer("read", {"path": "notes.txt"})

    async def run():
        ws = await chatws.connect()
        await chatws.coding(ws)
        frames = await chatws.turn(ws, {"type": "prompt", "text": "read my notes"})
        kinds = chatws.kinds(frames)
        assert kinds[:3] == ["turn_start", "tool_start", "tool_end"], kinds
        assert "tool_approval_request" not in kinds and kinds.count("turn_start") == 1
        start, end = frames[1], frames[2]
        assert start["tool"] == "read" and start["args"] == {"path": "notes.txt"}
        assert end["callId"] == start["callId"] and end["ok"] is True and "alpha" in end["result"]
        assert "".join(f["delta"] for f in frames if f["type"] == "text_delta") == "Done."
        # The second generation saw the call and its result.
        assert len(seen) == 2
        assistant, tool = seen[1][-2:]
        assert assistant["tool_calls"][0]["function"]["name"] == "read"
        assert tool == {"role": "tool", "tool_call_id": start["callId"], "name": "read", "content": end["result"]}
        session = [f for f in frames if f["type"] == "sessions"][-1]["activePath"]

        await ws.send_json_to({"type": "open_session", "path": session})
        history = await ws.receive_json_from(timeout=10)
        assert history["settings"]["codingTools"] is True
        user, answer = history["items"]
        assert answer["content"] == "Done." and answer["meta"]["aborted"] is False
        (round_,) = answer["meta"]["toolRounds"]
        assert round_["text"] == "" and round_["calls"][0] == {
            "id": start["callId"], "tool": "read", "args": {"path": "notes.txt"}, "ok": True, "result": end["result"]}
        await ws.receive_json_from()  # sessions

        # A later turn replays the tool round to the model; regenerate branches as before.
        await chatws.turn(ws, {"type": "prompt", "text": "again"})
        replayed = seen[2]
        assert [m["role"] for m in replayed] == ["user", "assistant", "tool", "assistant", "user"]
        assert replayed[3]["content"] == "Done." and replayed[2]["content"] == end["result"]
        frames = await chatws.turn(ws, {"type": "regenerate"})
        assert next(f for f in frames if f["type"] == "siblings")["count"] == 2
        await ws.disconnect()

    asyncio.run(run())


def test_gated_tool_deny_allow_and_always_allow(engine, workspace, steer, client, approvals):
    steer("write", {"path": "out/a.txt", "content": "hi"})

    async def ask(ws, answer: dict | None) -> list[dict]:
        await ws.send_json_to({"type": "prompt", "text": "write it"})
        frames = await chatws.until(ws, "tool_approval_request" if answer else "tool_end")
        if answer:
            request = frames[-1]
            assert request["tool"] == "write" and request["args"] == {"path": "out/a.txt", "content": "hi"}
            await ws.send_json_to({"type": "approval", "callId": request["callId"], **answer})
        return frames + await chatws.until(ws, "turn_end")

    async def run():
        ws = await chatws.connect()
        await chatws.coding(ws)
        frames = await ask(ws, {"decision": "deny"})
        end = next(f for f in frames if f["type"] == "tool_end")
        assert end["ok"] is False and "denied" in end["result"] and not (workspace / "out/a.txt").exists()
        assert "".join(f["delta"] for f in frames if f["type"] == "text_delta") == "Done."

        frames = await ask(ws, {"decision": "allow", "editedArgs": {"path": "out/a.txt", "content": "edited"}})
        assert next(f for f in frames if f["type"] == "tool_end")["ok"] is True
        assert (workspace / "out/a.txt").read_text() == "edited"
        assert "tool_approvals" not in chatws.kinds(frames)

        frames = await ask(ws, {"decision": "allow", "alwaysAllow": True})
        session = next(f for f in frames if f["type"] == "turn_start")["sessionId"]
        assert next(f for f in frames if f["type"] == "tool_approvals") == {
            "type": "tool_approvals", "sessionId": session, "alwaysAllow": ["write"]}
        assert (workspace / "out/a.txt").read_text() == "hi"
        from asgiref.sync import sync_to_async

        listed = (await sync_to_async(client.get)("/api/settings/tool-approvals")).json()
        assert listed["ok"] is True and {"session_id": session, "title": "write it",
                                         "always_allow": ["write"]} in listed["sessions"]

        frames = await ask(ws, None)  # asked no more
        assert "tool_approval_request" not in chatws.kinds(frames)
        assert next(f for f in frames if f["type"] == "tool_end")["ok"] is True
        await ws.disconnect()

    asyncio.run(run())


def test_the_speed_readout_counts_decoding_only(engine, workspace, steer, approvals):
    """A turn's tokens_per_s is what its generations decoded over the time that took (each one's tokens
    after its first, from its first token to its last): the call's markup counts though nobody sees it,
    and the second spent on the approval card does not."""
    steer("write", {"path": "speed.txt", "content": "x"})

    async def run():
        ws = await chatws.connect()
        await chatws.coding(ws)
        started = time.perf_counter()
        await ws.send_json_to({"type": "prompt", "text": "write it"})
        request = (await chatws.until(ws, "tool_approval_request"))[-1]
        await asyncio.sleep(1.0)  # the user reads the card
        await ws.send_json_to({"type": "approval", "callId": request["callId"], "decision": "allow"})
        end = (await chatws.until(ws, "turn_end"))[-1]
        await ws.disconnect()
        return end, 1000 * (time.perf_counter() - started)

    end, wall_ms = asyncio.run(run())
    assert (workspace / "speed.txt").read_text() == "x"
    # A rate over the turn's wall time would be below even the last round's tokens per second.
    assert end["tokens_per_s"] > end["completion_tokens"], end
    assert end["decode_tokens"] > end["completion_tokens"]  # the call's round is in it ("Done." alone is a few)
    assert 0 < end["decode_ms"] < wall_ms - 1000  # the second on the approval card is not in it
    assert end["tokens_per_s"] == pytest.approx(end["decode_tokens"] / end["decode_ms"] * 1000, rel=0.02)


def test_bash_streams_output_and_abort_kills_it(engine, workspace, steer, approvals):
    steer("bash", {"command": "sleep 60 & echo $! > sleep.pid; setsid sleep 1000 & echo $! > setsid.pid; "
                              "echo started; wait"})

    async def run():
        ws = await chatws.connect()
        await chatws.coding(ws)
        await ws.send_json_to({"type": "prompt", "text": "run it"})
        request = (await chatws.until(ws, "tool_approval_request"))[-1]
        await ws.send_json_to({"type": "approval", "callId": request["callId"], "decision": "allow"})
        update = (await chatws.until(ws, "tool_update"))[-1]
        assert update == {"type": "tool_update", "callId": request["callId"], "chunk": "started\n"}
        escaped = int((workspace / "setsid.pid").read_text())
        assert not chatws.gone(escaped, 0)  # it runs in a session of its own
        await ws.send_json_to({"type": "abort"})
        frames = await chatws.until(ws, "turn_end")
        end = next(f for f in frames if f["type"] == "tool_end")
        assert end["ok"] is False and "stopped" in end["result"]
        assert frames[-1]["aborted"] is True
        pid = int((workspace / "sleep.pid").read_text())
        assert chatws.gone(pid) and chatws.gone(escaped)
        await ws.disconnect()

    asyncio.run(run())


def test_a_turn_waiting_for_approval_waits_for_a_socket_that_comes_back(engine, workspace, steer, approvals):
    """A socket that closes while a call waits for approval leaves the turn
    waiting; the next socket on that chat gets the request again and answers it."""
    steer("bash", {"command": "touch ran"})

    async def run():
        ws = await chatws.connect()
        await chatws.coding(ws)
        await ws.send_json_to({"type": "prompt", "text": "run it"})
        start = await chatws.until(ws, "tool_approval_request")
        session = next(f for f in start if f["type"] == "turn_start")["sessionId"]
        await ws.disconnect()
        await asyncio.sleep(0.3)
        assert engine.active_rows == 0 and not (workspace / "ran").exists()  # nothing runs unapproved
        remote = await chatws.connect(client=("192.168.1.9", 40000))  # may not run coding tools: may not approve them
        await remote.send_json_to({"type": "open_session", "path": session})
        asked = await chatws.until(remote, "tool_approval_request")
        await remote.send_json_to({"type": "approval", "callId": asked[-1]["callId"], "decision": "allow",
                                   "editedArgs": {"command": "touch other"}})
        refused = await chatws.until(remote, "error")
        assert "loopback" in refused[-1]["message"] and not (workspace / "other").exists()
        await remote.disconnect()
        ws = await chatws.connect()
        await ws.send_json_to({"type": "open_session", "path": session})
        replayed = await chatws.until(ws, "tool_approval_request")  # the turn's frames from its first
        kinds = [f["type"] for f in replayed]
        assert kinds[:3] == ["history", "sessions", "turn_start"] and "tool_start" in kinds
        await ws.send_json_to({"type": "approval", "callId": replayed[-1]["callId"], "decision": "allow"})
        end = await chatws.until(ws, "tool_end")
        assert end[-1]["ok"] is True and (workspace / "ran").exists()
        assert [f["decision"] for f in end if f["type"] == "tool_approval_answered"] == ["allow"]
        await chatws.until(ws, "turn_end")
        await ws.disconnect()

    asyncio.run(run())


def test_path_escape_refused_and_frame_errors(engine, workspace, steer):
    from memory import service

    service.init()  # a vault, so its tools are on offer while the coding tools are off
    outside = workspace.parent / "secret.txt"
    outside.write_text("top secret")
    (workspace / "link.txt").symlink_to(outside)
    steer("read", {"path": "link.txt"})

    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "approval", "callId": "call_nope", "decision": "allow"})
        error = await ws.receive_json_from(timeout=10)
        assert error["type"] == "error" and "call_nope" in error["message"]
        await ws.send_json_to({"type": "set_coding_tools", "enabled": "yes"})
        assert (await ws.receive_json_from(timeout=10))["type"] == "error"

        frames = await chatws.turn(ws, {"type": "prompt", "text": "read it"})  # coding tools are off
        end = next(f for f in frames if f["type"] == "tool_end")  # told so, the model can correct itself
        assert end["ok"] is False and "unknown tool 'read'" in end["result"]

        await chatws.coding(ws)
        frames = await chatws.turn(ws, {"type": "prompt", "text": "read it"})
        end = next(f for f in frames if f["type"] == "tool_end")
        assert end["ok"] is False and "outside the workspace" in end["result"] and "top secret" not in end["result"]
        await ws.disconnect()

    asyncio.run(run())


def test_rounds_are_capped(engine, workspace, steer):
    (workspace / "x.txt").write_text("x")
    seen = steer("read", {"path": "x.txt"}, always=True)

    async def run():
        from chat.toolloop import MAX_ROUNDS

        ws = await chatws.connect()
        await chatws.coding(ws)
        frames = await chatws.turn(ws, {"type": "prompt", "text": "loop"})
        assert len(seen) == MAX_ROUNDS
        assert chatws.kinds(frames).count("tool_end") == MAX_ROUNDS - 1
        assert any(f["type"] == "error" and "tool-call rounds" in f["message"] for f in frames)
        assert frames[-1]["type"] == "turn_end"
        await ws.disconnect()

    asyncio.run(run())


def test_a_real_memory_tool_runs(engine, steer):
    from chat.tools import available
    from memory import service
    from memory.models import MemoryVault

    if not MemoryVault.objects.exists():  # no vault: nothing to offer, no prompt tokens spent on them
        assert not any(name.startswith("memory_") for name in available(False))
    service.init()  # the default vault, empty
    assert {"memory_search", "memory_list", "memory_read", "memory_links"} <= set(available(False))
    steer("memory_list", {})

    async def run():
        ws = await chatws.connect()
        frames = await chatws.turn(ws, {"type": "prompt", "text": "what do you remember?"})
        end = next(f for f in frames if f["type"] == "tool_end")
        assert end["ok"] is True and end["result"].startswith("Articles (")
        assert "tool_approval_request" not in chatws.kinds(frames)
        await ws.disconnect()

    asyncio.run(run())


# -- the tools themselves, without the engine --------------------------------
def test_workspace_paths_and_file_tools(workspace):
    from chat.tools import CODING_TOOLS, call_sync

    def call(name, args):
        return call_sync(CODING_TOOLS[name], args)

    assert call("write", {"path": "d/f.txt", "content": "one\ntwo two\n"}) == (True, "created d/f.txt (12 characters)")
    ok, text = call("read", {"path": "d/f.txt"})
    assert ok and text == "     1\tone\n     2\ttwo two"
    assert call("edit", {"path": "d/f.txt", "old_string": "two", "new_string": "x"})[1].endswith(
        "occurs 2 times in 'd/f.txt'; it must occur exactly once")
    assert call("edit", {"path": "d/f.txt", "old_string": "one", "new_string": "1"})[0]
    assert (workspace / "d/f.txt").read_text() == "1\ntwo two\n"
    for bad in ("../x", "/etc/passwd", "d/../../x"):
        ok, text = call("write", {"path": bad, "content": "no"})
        assert not ok and "outside the workspace" in text
    os.symlink("/etc", workspace / "etc")
    assert "outside the workspace" in call("read", {"path": "etc/hostname"})[1]
    assert "outside the workspace" in call("write", {"path": "etc/new", "content": "x"})[1]
    assert call("read", {}) == (False, "error: missing required argument(s): path")
    assert call("read", {"path": 3}) == (False, "error: argument 'path' must be of type string")
    assert call("bash", {"command": "echo hi; exit 3"}) == (False, "error: hi\n\n(exit code 3)")
    # 3 s: time for the reaper and a login shell to start and echo on a loaded machine (1 s was not always)
    ok, text = call("bash", {"command": "echo $PWD; sleep 30", "timeout": 3})
    assert not ok and str(workspace) in text and "killed after 3 s" in text
    ok, text = call("bash", {"command": "head -c 50000 /dev/zero | tr '\\0' a"})
    assert ok and text.endswith("(30000 more bytes of output dropped)")


def test_bash_sees_none_of_the_secrets(workspace, monkeypatch):
    """Every name in the one list (`core.procs.SECRET_ENV`) is kept from a tool's command."""
    from chat.tools import CODING_TOOLS, call_sync
    from core.procs import SECRET_ENV

    for name in (*SECRET_ENV, "HEARTH_NOT_A_SECRET"):
        monkeypatch.setenv(name, f"value-of-{name}")
    ok, text = call_sync(CODING_TOOLS["bash"], {"command": "env"})
    assert ok and "value-of-HEARTH_NOT_A_SECRET" in text
    assert [name for name in SECRET_ENV if f"value-of-{name}" in text] == []
