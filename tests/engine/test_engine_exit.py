"""A process that ran Hearth's engine exits cleanly (bench/device.py's engine
runner, and any tool that embeds `Engine`; `hearth serve` ends with
`os._exit`).

MLX keeps the streams a thread used (mlx-lm's generation stream is one per
thread) until `mx.clear_streams()` in that thread; left to the process's
static destructors, they aborted it with `terminate called without an
active exception` in 7 of 10 runs with OpenBLAS preloaded, after the work
was done. The engine thread clears them on its way out. The process itself
is what this tests, so it runs in one of its own."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from core import blas

SCRIPT = r"""
import asyncio, sys
from inference.engine.engine import Engine
from inference.engine.types import GenerationRequest

engine = Engine(sys.argv[1])
engine.start()

async def one(n):
    sub = engine.submit(GenerationRequest(prompt_tokens=[1, 2, 3, n], max_tokens=4))
    async for event in sub.events():
        if event.error:
            raise RuntimeError(event.error)

async def main():
    await one(0)  # a lone request (the single-row lane)
    await asyncio.gather(*[one(n) for n in range(3)])  # a batch

asyncio.run(main())
engine.close(drain_seconds=1)
print("served")
"""


def test_a_process_that_ran_the_engine_exits_cleanly(tiny_model):
    library = blas.find_openblas()
    if library is None:
        pytest.fail("OpenBLAS is not installed (`make test` installs libopenblas0-pthread)")
    env = {**os.environ, "LD_PRELOAD": library}
    for _ in range(3):  # the abort came in 7 of 10 runs
        done = subprocess.run([sys.executable, "-c", SCRIPT, tiny_model], env=env, capture_output=True, text=True,
                              timeout=120, cwd=Path(__file__).resolve().parents[2])
        assert (done.returncode, done.stdout.strip()) == (0, "served"), done.stderr[-2000:]
