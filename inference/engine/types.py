"""The engine's one request type and one event type."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

_ids = itertools.count(1)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 0.0  # 0 or 1 = off
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    seed: int | None = None


@dataclass
class GenerationRequest:
    prompt_tokens: list[int]
    max_tokens: int | None = None  # None: until EOS or the context window
    sampling: SamplingParams = field(default_factory=SamplingParams)
    logit_bias: dict[int, float] | None = None
    stop: list[str] = field(default_factory=list)
    id: int = field(default_factory=lambda: next(_ids))


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class GenerationEvent:
    """Text that is safe to show (complete characters, never part of a stop
    string), the tokens behind it, and on the last event the finish reason
    (`stop` or `length`) and usage. `error` ends a stream that failed."""

    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    error: str | None = None
