"""Router mode under the operator's --max-context: a model's process lists
the context it allows (`context_limit`), and the dashboard chat's reply cap,
prompt limit and context readout use that, not the model's larger window."""
from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from tests.helpers import ServerProcess, build_tiny_model, server_env

MODEL = "hearth-test/tiny-a"
CAP = 512  # the tiny model's window is 2048


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    root = tmp_path_factory.mktemp("router-capped")
    hf, hearth = root / "hf", root / "hearth"
    build_tiny_model(hf / "hub", MODEL)
    proc = ServerProcess(server_env(hf, hearth), "--default-model", MODEL, "--max-context", str(CAP),
                         "--no-worker", log_path=root / "router.log").wait_ready()
    yield proc
    assert proc.stop() == 0, proc.output()


def test_the_chat_uses_the_context_the_models_process_allows(capped):
    async def run():
        async with websockets.connect(capped.url.replace("http", "ws") + "/ws/chat", max_size=None) as ws:
            while json.loads(await asyncio.wait_for(ws.recv(), 60))["type"] != "sessions":
                pass
            await ws.send(json.dumps({"type": "prompt", "text": "Hello"}))
            frames = []
            while not frames or frames[-1]["type"] != "turn_end":
                frames.append(json.loads(await asyncio.wait_for(ws.recv(), 180)))
            return frames

    frames = asyncio.run(run())
    assert not [f for f in frames if f["type"] == "error"], frames
    [context] = [f for f in frames if f["type"] == "context"]
    assert context["contextWindow"] == CAP  # the old chat: the model's 2048, which its process refuses past 512
