"""The layout of HEARTH_HOME, in one place: every file and folder Hearth
keeps there. A new kind of state gets a function here, so the whole layout
reads at a glance (and the Settings table, docs/serving/settings.md, can name it).

The root is `core.paths.hearth_home()`: HEARTH_HOME (default ~/.hearth),
symlinks resolved, the one the request checks confine to; Django's
`settings.HEARTH_HOME` is this same path.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import os
from pathlib import Path

from core.paths import hearth_home as root


def database() -> Path:
    return root() / "hearth.sqlite3"  # Django's SQLite database (WAL)


def job_queue() -> Path:
    return root() / "jobs-queue.sqlite3"  # Huey's SQLite queue


def secret_key() -> Path:
    return root() / "secret_key"  # Django's secret key, made once


def static() -> Path:
    return root() / "static"  # collected static files (`hearth django collectstatic`, for a reverse proxy)


def static_cache() -> Path:
    return root() / "static-cache"  # the copies WhiteNoise serves, with their gzip variants (hearth/static.py)


def workspace() -> Path:
    return root() / "workspace"  # the chat's coding tools' folder (unless HEARTH_CHAT_WORKSPACE says otherwise)


def job_logs() -> Path:
    return root() / "jobs"  # one NDJSON event log per job


def adapters() -> Path:
    return root() / "adapters"  # fine-tuned and merged LoRA adapters


def datasets() -> Path:
    return root() / "datasets"  # the dataset builder's output


def exports() -> Path:
    return root() / "exports"  # fine-tune exports


def run() -> Path:
    return root() / "run"  # records of running worker processes


def demo_build(kind: str = "chat") -> Path:
    """The state of a demo build run for a server (`make-demo-model --background`; JSON: state, step,
    steps, loss, served_step): the chat model's, or the speech model's (`kind` "audio")."""
    return run() / ("demo-build.json" if kind == "chat" else f"demo-build-{kind}.json")


def demo_resume(kind: str = "chat") -> Path:
    """What a demo build cut short saved for the next build of its recipe to go on from (weights, optimizer
    state, step: serving/demo/resume.py); removed once a build finishes."""
    return root() / "demo-resume" / f"{kind}.safetensors"


def serving() -> Path:
    return root() / "serving"  # which snapshot each running server serves (GC keeps them)


def machine() -> Path:
    """This machine's measured bandwidths: HEARTH_MACHINE_FILE where set (so
    several homes on one machine share one reading), else in the home."""
    shared = os.environ.get("HEARTH_MACHINE_FILE")
    return Path(shared).expanduser() if shared else root() / "machine.json"


def blas_cache() -> Path:
    return root() / "blas.json"  # the BLAS libraries' measured speeds on this machine, and the pick


def library_changed() -> Path:
    return root() / "library-changed"  # touched when a job adds models to the HF cache


def hf_token() -> Path:
    return root() / "hf.json"  # the saved Hugging Face token (0600)


def vaults() -> Path:
    return root() / "memory"  # memory vaults created without a path


def memory_index(key: str) -> Path:
    return root() / "cache" / "memory-index" / f"{key}.v2.sqlite3"  # a vault's search index


def scratch() -> Path:
    return root() / "scratch"  # synthesis worktrees while they run


def prompt_caches() -> Path:
    return root() / "prompt-cache"  # router mode: each model's SSD prompt-cache tier, kept across unloads


def streams() -> Path:
    return root() / "streams"  # resumable streams: <sid>.sse (the bytes) and <sid>.json, owners/ (live locks)


def logs() -> Path:
    return root() / "logs"  # servers that `hearth run` started for itself


def mcp_config() -> Path:
    return root() / "mcp.json"  # the MCP servers whose tools the dashboard chat offers
