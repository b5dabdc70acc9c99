"""The engine's one request type and one event type."""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.engine.grammar import GrammarState
    from inference.engine.think import ThinkBound
    from inference.engine.vision import Image

_ids = itertools.count(1)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 0.0  # 0 or 1 = off
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    xtc_probability: float = 0.0  # 0 = off
    xtc_threshold: float = 0.1
    seed: int | None = None  # None: the engine's running random state


@dataclass(frozen=True)
class HlgParams:
    """HLG tone-curve sampling (`inference/engine/hlg.py`): a monotone
    transfer curve over each token's distance below the top logit. Widths
    are in logits (nats)."""

    enabled: bool = True
    width: float = 4.0  # the plateau: near-ties within this of the top are drawn together
    shoulder: float = 4.0  # how softly the plateau turns into the unchanged middle (0: a hard knee)
    toe: float = 6.0  # below the pivot, the span over which the tail is pushed down ever harder (0: off)
    pivot_offset: float = 6.0  # where the toe starts, this far below the top


@dataclass(frozen=True)
class LogitsParams:
    """Processors applied to the logits before logprobs and the sampler, in
    mlx-lm's order: bias, then repetition, presence and frequency penalties;
    then the grammar mask and last the HLG tone curve (when `hlg` is set and
    enabled), so the curve is measured from the best token the grammar allows."""

    logit_bias: dict[int, float] | None = None
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    presence_context_size: int = 20
    frequency_penalty: float | None = None
    frequency_context_size: int = 20
    hlg: HlgParams | None = None  # None: no tone curve


@dataclass
class GenerationRequest:
    prompt_tokens: list[int]
    max_tokens: int | None = None  # None: until EOS or the context window
    sampling: SamplingParams = field(default_factory=SamplingParams)
    logits: LogitsParams = field(default_factory=LogitsParams)
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False  # the chosen token's logprob on each event
    top_logprobs: int = 0  # and the k most likely tokens (0 = none)
    grammar: GrammarState | None = None  # one request's grammar matcher
    think: ThinkBound | None = None  # a bound on its reasoning block (think.py)
    session: str | None = None  # prompt-cache session affinity key
    adapters: tuple[str, ...] | None = None  # mounted LoRA ids, () for the base; None: the server default
    speculative: bool = True  # False: never decoded speculatively, even with a draft source mounted
    continues: bool = False  # the prompt ends inside text the reply goes on from: its first token keeps a leading space
    # A vision model's images, in prompt order, and the prompt's cache key (each image's run of
    # image tokens replaced by ids from its hash; see vision.py). None: the prompt is its own key.
    images: tuple[Image, ...] = ()
    cache_key: list[int] | None = None
    id: int = field(default_factory=lambda: next(_ids))

    def sibling(self, index: int, grammar: GrammarState | None) -> GenerationRequest:
        """Choice `index` of the same request: an id and a grammar matcher of its
        own and, with a seed, the seed plus `index` (the choices differ, and
        each is the same again for the same seed)."""
        seed = self.sampling.seed
        sampling = self.sampling if seed is None else dataclasses.replace(self.sampling, seed=(seed + index) % 2**64)
        think = self.think.fresh() if self.think is not None else None
        return dataclasses.replace(self, id=next(_ids), grammar=grammar, sampling=sampling, think=think)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prompt cache
    lane: str = "serial"  # "serial" | "serial+spec" | "batched": the lane that ran the request
    # {"drafted", "accepted", "targetCalls"} when the request was decoded speculatively
    speculation: dict | None = None
    # Where its time went, in ms: queue (submitted to admitted), prefill (to the first token), decode
    # (first to last token), and within decoding the grammar's masks and the detokenizer (rows.Row.timings).
    timings: dict | None = None
    # {"events", "injected", "strict", "spanLens", "decodeSteps"} when it decoded with jump-forward
    # (speculate.py): forced spans appended, their tokens, each span's length, and the sampling steps.
    fill: dict | None = None

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
    logprobs: dict | None = None  # mlx-lm's entry for this token, when asked
    finish_reason: str | None = None
    usage: Usage | None = None
    stop_sequence: str | None = None  # on the last event: the stop string that ended the text
    error: str | None = None
    error_status: int = 500  # the HTTP status a non-streamed answer gives the error
    error_param: str | None = None  # the request field at fault, when there is one

    @property
    def cut(self) -> bool:
        """The generation was ended for the model, not by it: its token limit
        or a stop sequence cut the text where it stood."""
        return self.finish_reason == "length" or self.stop_sequence is not None

    @property
    def final_usage(self) -> Usage:
        """The usage the last event of a finished generation carries."""
        if self.usage is None:
            raise ValueError("only the last event of a finished generation carries usage")
        return self.usage


# What `Submission.events()` answers: an async generator, so a reader that
# stops early can `aclose()` it.
EventStream = AsyncGenerator[GenerationEvent, None]
