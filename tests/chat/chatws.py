"""Talking to /ws/chat in this process (Channels' WebsocketCommunicator on
the ASGI application), and reading what comes back."""
from __future__ import annotations

import json
import time
from pathlib import Path

from channels.testing import WebsocketCommunicator


def forced(text: str) -> str:
    return "root ::= " + json.dumps(text)


def markup(name: str, args: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def asgi_app():
    from hearth.asgi import application

    return application


LOOPBACK = ("127.0.0.1", 50000)


async def connect(headers=None, client=LOOPBACK, app=None, **scope) -> WebsocketCommunicator:
    """A socket from `client` (loopback unless told; Channels' communicator sets
    no peer), with any further scope keys given."""
    ws = WebsocketCommunicator(app or asgi_app(), "/ws/chat", headers=headers or [(b"host", b"testserver")])
    ws.scope.update(scope, client=list(client) if client else None)
    connected, _ = await ws.connect()
    assert connected
    ready = await ws.receive_json_from(timeout=10)
    assert ready["type"] == "ready" and ready["model"] and "genDefaults" in ready
    assert (await ws.receive_json_from())["type"] == "sessions"
    return ws


async def turn(ws, frame: dict) -> list[dict]:
    """Send a frame and collect frames up to turn_end, which comes last."""
    await ws.send_json_to(frame)
    frames = []
    while True:
        f = await ws.receive_json_from(timeout=60)
        frames.append(f)
        if f["type"] == "turn_end":
            return frames


async def new_session(ws) -> str:
    """A new chat on `ws`: its id (the chat list that follows is read too)."""
    await ws.send_json_to({"type": "new_session"})
    session = (await ws.receive_json_from(timeout=10))["sessionId"]
    await ws.receive_json_from(timeout=10)  # sessions
    return session


async def history(ws, session: str) -> list[dict]:
    """The stored messages of `session`, as the page opens it."""
    await ws.send_json_to({"type": "open_session", "path": session})
    while (frame := await ws.receive_json_from(timeout=10))["type"] != "history":
        assert frame["type"] != "error", frame
    return frame["items"]


async def until(ws, kind: str, timeout: float = 60) -> list[dict]:
    frames = []
    while not frames or frames[-1]["type"] != kind:
        frames.append(await ws.receive_json_from(timeout=timeout))
    return frames


async def coding(ws, enabled: bool = True) -> None:
    await ws.send_json_to({"type": "set_coding_tools", "enabled": enabled})
    assert await ws.receive_json_from(timeout=10) == {"type": "coding_tools", "active": enabled, "pending": False}


def kinds(frames):
    return [f["type"] for f in frames]


def gone(pid: int, seconds: float = 5) -> bool:
    """Whether process `pid` exits (or is a zombie waiting for whoever inherited it) within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
        except (FileNotFoundError, IndexError):
            return True
        if state in "ZX":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
