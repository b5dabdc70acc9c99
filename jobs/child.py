"""The child process of a job: `python -m jobs.child RUN_MODULE LOG CONFIG_FILE`
(CONFIG_FILE holds the job's settings as JSON).

RUN_MODULE is the module its kind registered (`jobs.registry`); its
`run(config, log, stage_delay)` does the work.

All MLX work of a job happens here, so a crash or an out-of-memory kill
takes down this process only; the worker sees the exit and records why.
The child dies with its worker (SIGKILL): the worker starts it with
`core.procs.spawn`, and it watches its parent too (`tie_to_spawner`)."""
from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import traceback

from core import torchless
from core.procs import tie_to_parent, tie_to_spawner
from jobs.events import open_log

REDIS_ENV = "HEARTH_REDIS_URL"  # set: the events go to the job's Redis stream


def main(argv: list[str]) -> int:
    run_module, log_path, config_file = argv
    if tie_to_spawner() is None:  # run by hand: tied to whoever started it
        tie_to_parent(os.getppid(), signal.SIGKILL)
    torchless.install()  # transformers without torch (core/torchless.py)
    log = open_log(log_path, os.environ.get(REDIS_ENV, ""))
    with open(config_file, encoding="utf-8") as f:
        config = json.load(f)
    delay = float(os.environ.get("HEARTH_JOB_STAGE_DELAY") or 0)
    try:
        runner = importlib.import_module(run_module)  # the kind's module, named by its registration
        output_dir, summary = runner.run(config, log, delay)
    except Exception as exc:
        traceback.print_exc()
        log.emit("failed", error=reason(exc))
        return 1
    log.emit("done", output_dir=output_dir, summary=summary)
    return 0


def reason(exc: Exception) -> str:
    """A failed job's error as its page shows it. The kinds raise ValueError (PathRefused is one)
    and the engine's typed errors with sentences written to be read as they are; anything else
    keeps its type's name, the clue to what went wrong."""
    from inference.engine.errors import EngineError

    if isinstance(exc, (ValueError, EngineError)) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
