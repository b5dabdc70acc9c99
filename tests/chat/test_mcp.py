"""MCP servers' tools in the dashboard chat (chat/mcp.py), with the official
SDK on both ends: a stdio server and a streamable-HTTP one (tests/mcp_server.py),
the configuration through /api/settings/mcp, and a call made in a real
/ws/chat turn behind the approval card. The Settings page's MCP card is
tested with the other pages, in tests/browser/test_dashboard.py (its
browser and server are there already)."""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chat import chatws

SERVER = str(Path(__file__).parents[1] / "mcp_server.py")
CALC = {"command": sys.executable, "args": [SERVER], "env": {"SECRET": "s3cret"}}


@pytest.fixture
def mcp_home(django_ready):
    from chat import mcp

    yield mcp
    mcp.config_path().unlink(missing_ok=True)
    asyncio.run(mcp.refresh())  # nothing configured: no MCP tools offered to later tests


def _put(client, body) -> tuple[int, dict]:
    r = client.put("/api/settings/mcp", json.dumps(body), content_type="application/json")
    return r.status_code, r.json()


def test_settings_store_check_mask_and_list(client, mcp_home):
    code, body = _put(client, {"servers": {"calc": CALC, "broken": {"command": "/nonexistent/server"}}})
    assert code == 200 and body["ok"]
    assert body["servers"]["calc"]["env"] == {"SECRET": "********"}  # secrets never come back
    assert body["status"]["calc"] == {"tools": ["add", "fail", "env_value"], "error": None}
    assert body["status"]["broken"]["tools"] == [] and "nonexistent" in body["status"]["broken"]["error"]
    assert json.loads(mcp_home.config_path().read_text())["mcpServers"]["calc"]["env"] == {"SECRET": "s3cret"}

    # Sent back masked (as the page does), the stored value stays.
    code, _ = _put(client, {"servers": {"calc": body["servers"]["calc"]}})
    assert code == 200 and json.loads(mcp_home.config_path().read_text())["mcpServers"]["calc"]["env"] == {
        "SECRET": "s3cret"}
    assert client.get("/api/settings/mcp").json()["status"] == {"calc": {"tools": ["add", "fail", "env_value"],
                                                                        "error": None}}
    # A stdio server is a command this machine runs: not configurable from another machine without signing in.
    r = client.put("/api/settings/mcp", json.dumps({"servers": {}}), content_type="application/json",
                   REMOTE_ADDR="192.168.1.5")
    assert r.status_code == 403 and "sign in" in r.json()["error"] and mcp_home.load() != {}
    from django.test import override_settings

    with override_settings(HEARTH_MCP_COMMANDS=False):
        code, body = _put(client, {"servers": {"calc": CALC}})
        assert code == 403 and "HEARTH_MCP_COMMANDS=0" in body["error"]
    for bad, where in [({"servers": {"a b": CALC}}, "name"), ({"servers": {"x": {}}}, "either `command`"),
                       ({"servers": {"x": {"url": "ftp://h"}}}, "http(s) URL"),
                       ({"servers": {"x": {"command": "c", "args": "one"}}}, "list of strings")]:
        code, body = _put(client, bad)
        assert code == 400 and where in body["error"], body


def test_tools_run_in_their_server_without_this_servers_keys(mcp_home, monkeypatch):
    monkeypatch.setenv("HEARTH_API_KEY", "must-not-leak")
    mcp_home.save({"mcpServers": {"calc": CALC}})

    async def run():
        await mcp_home.refresh()
        tools = mcp_home.provider()
        assert set(tools) == {"calc__add", "calc__fail", "calc__env_value"} and all(t.gated for t in tools.values())

        async def emit(_):
            pass

        # Each call starts the server's process; a call's result (calc__add's "42") is checked in the chat test
        # below, through the approval card.
        assert await tools["calc__env_value"].stream({"name": "SECRET"}, emit) == "s3cret"
        assert await tools["calc__env_value"].stream({"name": "HEARTH_API_KEY"}, emit) == ""
        from chat.tools import ToolError

        with pytest.raises(ToolError):
            await tools["calc__fail"].stream({"reason": "no"}, emit)

    asyncio.run(run())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_streamable_http_server(mcp_home):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "streamable-http", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "the MCP server did not start"
                time.sleep(0.2)
        mcp_home.save({"mcpServers": {"web": {"url": f"http://127.0.0.1:{port}/mcp",
                                              "headers": {"X-Token": "t"}}}})

        async def run():
            assert (await mcp_home.refresh())["web"].error is None

            async def emit(_):
                pass

            return await mcp_home.provider()["web__add"].stream({"a": 1, "b": 2}, emit)

        assert asyncio.run(run()) == "3"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_chat_calls_an_mcp_tool_after_approval(engine, workspace, steer, approvals, mcp_home):
    mcp_home.save({"mcpServers": {"calc": CALC}})
    seen = steer("calc__add", {"a": 19, "b": 23})

    async def run():
        ws = await chatws.connect()
        await ws.send_json_to({"type": "prompt", "text": "add 19 and 23"})
        frames = await chatws.until(ws, "tool_approval_request")
        request = frames[-1]
        assert request["tool"] == "calc__add" and request["args"] == {"a": 19, "b": 23}
        await ws.send_json_to({"type": "approval", "callId": request["callId"], "decision": "allow"})
        frames += await chatws.until(ws, "turn_end")
        end = next(f for f in frames if f["type"] == "tool_end")
        assert end["ok"] is True and end["result"] == "42"
        assert seen[-1][-1] == {"role": "tool", "tool_call_id": end["callId"], "name": "calc__add", "content": "42"}
        await ws.disconnect()

    asyncio.run(run())
