"""Find a model on this machine and load it for serving.

A model reference is a local directory or a repo id already in the local
Hugging Face cache. Nothing here downloads: an unknown reference is a
`ModelNotFound` that names it. mlx-lm and the tokenizer open the folder's
files by name, so a folder holding a FIFO, a device or a socket is refused
before anything is opened (a FIFO would block the load forever).
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from core import device
from core.modelconfig import context_window
from core.paths import PathRefused, read_json, regular_entries
from inference.engine import fastmath
from inference.engine.errors import ModelLoadError, ModelNotFound

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    from inference.engine.adapters import AdapterManager
    from inference.engine.grammar import GrammarCompiler
    from inference.engine.vision import Vision

log = logging.getLogger("hearth.engine")


@dataclass
class LoadedModel:
    model_id: str
    path: Path
    model: nn.Module
    tokenizer: TokenizerWrapper
    config: dict
    generation_config: dict
    dtype: str
    vision: Vision | None = None  # a vision-language model's tower and image processor (vision.py)

    @cached_property
    def grammar_compiler(self) -> GrammarCompiler:
        """Compiles structured-output constraints for this tokenizer (lazily:
        xgrammar and torch load on the first constrained request)."""
        from inference.engine.grammar import GrammarCompiler

        hf = getattr(self.tokenizer, "_tokenizer", self.tokenizer)
        return GrammarCompiler(hf, self.vocab_size, sorted(self.tokenizer.eos_token_ids))

    @cached_property
    def adapters(self) -> AdapterManager:
        """The LoRA adapters mounted into this model (engine thread only
        mounts them; see inference.engine.adapters)."""
        from inference.engine.adapters import AdapterManager

        return AdapterManager(self.model)

    @property
    def newline_ids(self) -> list[int]:
        """Tokens of "\n": exempt from XTC, as in mlx_lm.server."""
        return list(self.tokenizer.encode("\n", add_special_tokens=False))

    @property
    def vocab_size(self) -> int:
        value = self.config.get("vocab_size") or self.config.get("text_config", {}).get("vocab_size")
        return int(value) if value else len(self.tokenizer.get_vocab())

    @cached_property
    def weights_bytes(self) -> int:
        return sum(v.nbytes for v in _leaves(self.model.parameters()))

    @property
    def is_embedding_model(self) -> bool:
        """The name or config says so (Qwen3-Embedding and the like)."""
        names = [self.model_id, self.path.name, *self.config.get("architectures", []),
                 str(self.config.get("model_type", ""))]
        return any("embed" in n.lower() for n in names) or bool(self.config.get("is_embedding_model"))

    @property
    def _text_config(self) -> dict:
        return {**self.config.get("text_config", {}), **self.config}

    @property
    def head_dim(self) -> int | None:
        cfg = self._text_config
        heads = cfg.get("num_attention_heads") or cfg.get("n_head")
        hidden = cfg.get("hidden_size") or cfg.get("n_embd")
        value = cfg.get("head_dim") or (hidden // heads if hidden and heads else None)
        return int(value) if value else None

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """Bytes one token of context takes in the KV cache (keys and values,
        every layer), from the config; 0 when the config does not say."""
        cfg = self._text_config
        layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers")
        kv_heads = cfg.get("num_key_value_heads") or cfg.get("num_attention_heads") or cfg.get("n_head")
        if not (layers and kv_heads and self.head_dim):
            return 0
        itemsize = 4 if "float32" in self.dtype else 2
        return 2 * int(layers) * int(kv_heads) * self.head_dim * itemsize

    @property
    def context_window(self) -> int | None:
        return context_window(self.config)


def resolve(ref: str) -> tuple[str, Path]:
    """(model id, directory) for a local path or a cached repo id."""
    path = Path(ref).expanduser()
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            if config.exists():
                raise ModelNotFound(f"model: {config} is not a regular file")
            raise ModelNotFound(f"model directory {path} has no config.json")
        return path.resolve().name, path.resolve()
    from huggingface_hub import constants, try_to_load_from_cache

    found = None
    if ref.count("/") == 1 and not ref.startswith((".", "/", "~")):
        found = try_to_load_from_cache(ref, "config.json")
    if not isinstance(found, str):
        raise ModelNotFound(
            f"model '{ref}' is neither a directory nor a repo in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); Hearth never downloads at load time")
    return ref, Path(found).parent


def _leaves(tree: Any) -> list[Any]:
    """The arrays of a parameter tree. `tree_flatten` is typed as a list or a
    dict; without a destination it answers a list of (name, array)."""
    from mlx.utils import tree_flatten

    return [v for _, v in cast("list[tuple[str, Any]]", tree_flatten(tree))]


def _float32_bytes(model: nn.Module) -> int:
    """Bytes the model's weights take once dequantized and upcast to float32."""
    import mlx.nn as nn

    total = 0
    for _, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            rows, packed = module.weight.shape[-2:]
            total += rows * packed * 32 // module.bits * (module.weight.size // (rows * packed))
            total += module.bias.size if "bias" in module else 0
        elif not module.children():
            total += sum(v.size for v in _leaves(module.parameters()))
    return total * 4


def memory_budget() -> int:
    """Three quarters of the memory models live in: RAM, or an NVIDIA card's own (core.device)."""
    return int(device.describe()["memory_bytes"] * 0.75)


def _upcast_for_cpu(model: nn.Module, keep_dtype: bool) -> str:
    """On the CPU, bf16 and quantized matmuls have no BLAS path and run
    several times slower than float32: dequantize and upcast when it fits."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.utils import dequantize_model

    def stored() -> str:
        dtypes = {str(v.dtype) for v in _leaves(model.parameters())}
        return ",".join(sorted(d.removeprefix("mlx.core.") for d in dtypes))

    if keep_dtype or mx.default_device() != mx.cpu or sys.platform == "darwin":
        return stored()
    need, budget = _float32_bytes(model), memory_budget()
    if budget and need > budget:
        log.warning("float32 copy needs %.1f GiB, over the %.1f GiB budget: keeping stored dtype",
                    need / 2**30, budget / 2**30)
        return stored()
    if any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules()):
        dequantize_model(model)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return stored()


def _generation_config(path: Path) -> dict:
    """generation_config.json, or {} when the folder has none."""
    try:
        found = read_json(path / "generation_config.json", "model")
    except FileNotFoundError:
        return {}
    except PathRefused as exc:
        raise ModelLoadError(str(exc)) from None
    except (OSError, ValueError) as exc:  # mlx-lm passes over a broken one too
        log.warning("%s cannot be read, ignored: %s", path / "generation_config.json", exc)
        return {}
    return found if isinstance(found, dict) else {}


def load(ref: str, keep_dtype: bool = False) -> LoadedModel:
    """Load a model and tokenizer. Must run on the engine thread."""
    from mlx_lm import load as mlx_load

    model_id, path = resolve(ref)
    try:
        regular_entries(path, "model")  # config, tokenizer, weights: before mlx-lm opens any
    except PathRefused as exc:
        raise ModelLoadError(f"could not load model '{ref}': {exc}") from None
    config = _config(path)
    if config is not None and _is_vision(config):
        return _load_vision(ref, model_id, path, config, keep_dtype)
    try:
        # Typed as a union of the 2- and 3-tuple; return_config=True answers the 3-tuple.
        model, tokenizer, config = cast("tuple[nn.Module, TokenizerWrapper, dict]",
                                        mlx_load(str(path), return_config=True))
    except Exception as exc:  # mlx-lm raises ValueError, FileNotFoundError, KeyError...
        raise ModelLoadError(f"could not load model '{ref}': {exc}") from exc
    dtype = _upcast_for_cpu(model, keep_dtype)
    fastmath.install(model)  # after the upcast: it serves float32 only
    generation = _generation_config(path)
    _harmony_stops(tokenizer)
    log.info("loaded %s from %s (weights %s)", model_id, path, dtype)
    return LoadedModel(model_id, path, model, tokenizer, config, generation, dtype)


HARMONY_STOPS = ("<|return|>", "<|call|>")  # gpt-oss ends a reply on one of these (protocols/harmony.py)


def _harmony_stops(tokenizer) -> None:
    """A harmony model stops on `<|return|>` and `<|call|>` even when its
    checkpoint's generation config does not list them."""
    vocab = tokenizer.get_vocab()
    if "<|channel|>" in vocab and all(t in vocab for t in HARMONY_STOPS):
        for token in HARMONY_STOPS:
            tokenizer.add_eos_token(token)


def _config(path: Path) -> dict | None:
    try:
        found = read_json(path / "config.json", "model")
    except (OSError, ValueError):
        return None  # mlx-lm reports it
    return found if isinstance(found, dict) else None


def _is_vision(config: dict) -> bool:
    from inference.engine.vision import is_vision_config

    return is_vision_config(config)


def _load_vision(ref: str, model_id: str, path: Path, config: dict, keep_dtype: bool) -> LoadedModel:
    """A vision-language model: mlx-vlm loads it; the lanes run its language
    model as an mlx-lm text model on the same weights (see vision.py)."""
    from mlx_lm.utils import load_tokenizer

    from inference.engine import vision

    try:
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except Exception as exc:
        raise ModelLoadError(f"could not load model '{ref}': {exc}") from exc
    # The whole VLM is upcast first, so the text model shares the arrays it serves with.
    probe = vision.load_vlm(path)
    _upcast_for_cpu(probe, keep_dtype)
    text, tower = vision.wrap(probe, path, config)
    dtype = _upcast_for_cpu(text, True)  # already upcast: this only reads the dtype
    generation = _generation_config(path)
    log.info("loaded vision model %s from %s (weights %s, %d tokens per image)", model_id, path, dtype,
             tower.tokens_per_image)
    return LoadedModel(model_id, path, text, tokenizer, config, generation, dtype, vision=tower)
