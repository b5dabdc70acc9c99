"""A model sharded across processes with MLX's own distributed backend.

Every process (a "rank") is started by `mlx.launch`, which tells each one its
rank and how to reach the others (the ring backend on TCP, MPI, JACCL over
Thunderbolt RDMA). `mx.distributed.init()` joins them into one group; mlx-lm
does the sharding itself (`mlx_lm.utils.sharded_load`):

- tensor parallel (the default, models with `shard(group)`): every linear
  layer of attention and MLP is split across the ranks, each rank holds
  1/N of those weights and the ranks sum partial results twice per layer;
- pipeline (`pipeline=True`, models with `model.pipeline(group)`): each
  rank holds a run of whole layers and hands activations to the next.

Every rank runs the same forward passes in lockstep, so every rank must see
the same inputs: rank 0 decides them and `share_ids` passes them to the
others over the group. Greedy decoding then picks the same token on every
rank (the sharded layers end in an all-sum, so every rank holds the same
logits). Nothing here downloads: a reference is resolved like any served
model (`loader.resolve`), and every host must hold the same files.
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from core.paths import PathRefused, regular_entries
from inference.engine import loader
from inference.engine.errors import ModelLoadError

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

log = logging.getLogger("hearth.engine")

BACKENDS = ("any", "ring", "mpi", "jaccl", "nccl")


class DistributedError(ModelLoadError):
    """The ranks cannot form a group, or the model cannot be split across them."""


def join_group(backend: str = "any") -> mx.distributed.Group:
    """The group of every rank `mlx.launch` started; a group of one when this
    process was started alone (no backend configured)."""
    import mlx.core as mx

    if backend not in BACKENDS:
        raise DistributedError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if backend != "any" and not mx.distributed.is_available(backend):
        raise DistributedError(f"this MLX build has no {backend!r} distributed backend")
    try:
        return mx.distributed.init(strict=backend != "any", backend=backend)
    except RuntimeError as exc:  # a strict init that could not reach its peers
        raise DistributedError(f"could not join the {backend} group: {exc}") from exc


def share_ids(group: mx.distributed.Group, ids: list[int]) -> list[int]:
    """Rank 0's token ids on every rank (the others' `ids` are ignored): a
    length and then the ids, each an all-sum to which only rank 0 adds."""
    import mlx.core as mx

    if group.size() == 1:
        return list(ids)
    mine = group.rank() == 0
    total = mx.distributed.all_sum(mx.array(len(ids) if mine else 0), group=group, stream=mx.cpu)
    n = cast(int, total.item())
    values = mx.array(ids, dtype=mx.int32) if mine else mx.zeros((n,), dtype=mx.int32)
    shared = mx.distributed.all_sum(values, group=group, stream=mx.cpu)
    return [int(v) for v in cast("list[int]", shared.tolist())]


def load_sharded(ref: str, group: mx.distributed.Group, pipeline: bool = False,
                 keep_dtype: bool = False) -> loader.LoadedModel:
    """This rank's shard of a text model (all ranks call it together). A group
    of one loads the whole model as `loader.load` does."""
    if group.size() == 1:
        return loader.load(ref, keep_dtype=keep_dtype)
    model_id, path = loader.resolve(ref)
    try:
        regular_entries(path, "model")
    except PathRefused as exc:
        raise ModelLoadError(f"could not load model '{ref}': {exc}") from None
    config = loader._config(path) or {}
    if loader._is_vision(config):
        raise DistributedError(f"model '{ref}' is a vision model; sharded loading takes text models only")
    if pipeline and not (path / "model.safetensors.index.json").is_file():
        raise DistributedError(f"pipeline sharding reads model.safetensors.index.json, which '{ref}' lacks "
                               "(a model saved as one file); shard it by tensor instead")
    from mlx_lm.utils import sharded_load

    try:
        model, tokenizer, config = cast("tuple[nn.Module, TokenizerWrapper, dict]", sharded_load(
            str(path), pipeline_group=group if pipeline else None, tensor_group=None if pipeline else group,
            return_config=True))
    except ValueError as exc:  # mlx-lm: "does not support tensor parallelism", shapes that do not divide...
        raise DistributedError(f"could not shard model '{ref}' across {group.size()} ranks: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(f"could not load model '{ref}': {exc}") from exc
    dtype = _upcast_shard(model, keep_dtype)
    log.info("rank %d/%d loaded its %s shard of %s (weights %s)", group.rank(), group.size(),
             "pipeline" if pipeline else "tensor", model_id, dtype)
    return loader.LoadedModel(model_id, path, model, tokenizer, config, loader._generation_config(path), dtype)


def _upcast_shard(model: nn.Module, keep_dtype: bool) -> str:
    """float32 on a Linux CPU, as `loader` does for a whole model, when this
    rank's shard fits; quantized shards keep their dtype (their sharded
    layers have no dequantized form in mlx)."""
    import mlx.core as mx

    leaves = loader._leaves(model.parameters())
    quantized = any(type(m).__name__.startswith("Quantized") for _, m in model.named_modules())
    budget = loader.memory_budget()
    fits = not budget or sum(v.size for v in leaves) * 4 <= budget
    if not (keep_dtype or quantized or mx.default_device() != mx.cpu or sys.platform == "darwin") and fits:
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
        leaves = loader._leaves(model.parameters())
    return ",".join(sorted({str(v.dtype).removeprefix("mlx.core.") for v in leaves}))


@dataclass
class Greedy:
    tokens: list[int]
    logprobs: list[float]  # each chosen token's log-probability
    text: str
    prompt_tokens: int
    prompt_seconds: float  # prefill, up to the first generated token
    decode_steps: int  # forward passes after the first token (an end-of-sequence one included)
    decode_seconds: float

    @property
    def decode_tps(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_steps and self.decode_seconds > 0 else 0.0


def greedy(loaded: loader.LoadedModel, prompt_ids: list[int], max_tokens: int) -> Greedy:
    """Greedy decoding of `prompt_ids` up to an end-of-sequence token or
    `max_tokens`; every rank of a sharded model calls it with the same ids."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    eos = set(loaded.tokenizer.eos_token_ids)
    tokens: list[int] = []
    logprobs: list[float] = []
    steps = 0
    started = time.perf_counter()
    first = started
    step: Any = generate_step(mx.array(prompt_ids), loaded.model, max_tokens=max_tokens)
    for token, scores in step:
        if steps == 0:
            first = time.perf_counter()
        steps += 1
        if int(token) in eos:
            break
        tokens.append(int(token))
        logprobs.append(float(scores[int(token)].item()))
    ended = time.perf_counter()
    return Greedy(tokens, logprobs, loaded.tokenizer.decode(tokens), len(prompt_ids), first - started,
                  max(steps - 1, 0), ended - first)
