"""Job kinds, registered by the apps that own them.

A kind names the module whose `run(config, log, stage_delay)` does the work
in the job's child process (it returns the output folder and a summary),
the Schema that describes its submit body (the submit route documents that
body with it), and, optionally, what to do once a job of that kind has
ended, however it ended (done, failed, cancelled while queued, or found a
zombie). The jobs app registers quantize, fine-tune and the dataset builder
(`jobs/apps.py`); memory registers synthesis from its own AppConfig.
Nothing in the jobs app names another app's kind, and nothing here imports
a kind's module: the web process and the worker only hold its name."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import BaseModel


@dataclass(frozen=True)
class JobKind:
    name: str
    run_module: str  # imported in the job's child process only
    schema: type[BaseModel]  # the submit body, as the OpenAPI document shows it
    after_end: Callable | None = None  # (job) -> None, in the worker (or the server, for a queued cancel)


_KINDS: dict[str, JobKind] = {}


def register(kind: JobKind) -> None:
    _KINDS[kind.name] = kind


def get(name: str) -> JobKind:
    try:
        return _KINDS[name]
    except KeyError:
        raise ValueError(f"unknown job kind {name!r}; registered: {', '.join(sorted(_KINDS))}") from None


def names() -> list[str]:
    return sorted(_KINDS)
