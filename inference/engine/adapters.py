"""LoRA adapters mounted into the served model and chosen per request.

Mounting wraps each target linear layer in a `_Slot` once; the slot adds
the residual `scale * (x @ a) @ b` of every adapter in the *active set* to
the base layer's output, so several adapters can be stacked ("a+b") and
the base model stays one forward away ("none"). The engine sets the active
set when a group of rows with the same adapter set starts, so rows that
batch together always share it.

Mounting is all-or-nothing: every tensor in the file is checked against the
layer it targets before any layer is touched. Every mount gets a new
generation number, and prompt-cache namespaces are built from (id,
generation), so KV computed under an adapter's old weights is never reused
once it is replaced.

Mutations run on the engine thread (through `Engine.call`); `ids()`,
`describe()` and `default` are safe to read from any thread.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.paths import TRAINING_MARKER, PathRefused, read_json, regular_file
from inference.engine.errors import EngineError

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
RESERVED = ("none", "base")


class AdapterError(EngineError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_adapter"
    param = "adapter"


class AdapterNotMounted(AdapterError):
    status = 404
    code = "adapter_not_mounted"


def parse_spec(value) -> tuple[str, ...] | None:
    """The request's `adapter` field: None (absent: the server default),
    () for the base model ("none"), or the ordered ids of "a+b" / "a,b"."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise AdapterError("adapter must be a string: a mounted adapter id, ids joined by '+', or 'none'")
    value = value.strip()
    if value == "" or value.lower() in RESERVED:
        return ()
    ids = tuple(part.strip() for part in re.split(r"[+,]", value))
    if any(not part for part in ids):
        raise AdapterError(f"adapter {value!r} has an empty id; join mounted ids with '+', as in 'a+b'")
    if len(set(ids)) != len(ids):
        raise AdapterError(f"adapter {value!r} names the same adapter twice")
    return ids


def read_config(path: Path) -> dict:
    """adapter_config.json, or {} when the folder has none; a FIFO or a
    device in its place is refused before anything opens it."""
    file = path / "adapter_config.json"
    try:
        config = read_json(file, "adapter")
    except FileNotFoundError:
        return {}
    except PathRefused as exc:
        raise AdapterError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{file} cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{file} is not a JSON object")
    return config


def _lora_numbers(config: dict, file: Path, fallback_rank: int) -> tuple[int, float]:
    params = config.get("lora_parameters") or {}
    try:
        rank = int(params.get("rank") or fallback_rank)
        scale = float(params.get("scale", 20.0))
    except (TypeError, ValueError, AttributeError):
        raise AdapterError(f"{file}: lora_parameters.rank and .scale must be numbers") from None
    return rank, scale


@dataclass(eq=False)  # compared by identity: a remount is a different adapter
class Adapter:
    id: str
    path: str
    rank: int
    scale: float
    base_model: str | None
    generation: int
    size_bytes: int
    layers: dict[str, tuple] = field(repr=False)  # module path -> (lora_a, lora_b)

    @property
    def ram_bytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.layers.values())

    def describe(self) -> dict:
        return {"id": self.id, "path": self.path, "rank": self.rank, "scale": self.scale,
                "size_bytes": self.size_bytes, "mounted_layers": len(self.layers), "ram_bytes": self.ram_bytes,
                "base_model": self.base_model}


def _slot_class():
    import mlx.nn as nn

    class _Slot(nn.Module):
        """A linear layer plus the LoRA residuals of the active adapters."""

        def __init__(self, base, path: str, manager: "AdapterManager"):
            super().__init__()
            self.base = base
            self.slot_path = path  # plain attributes: not parameters
            self.manager = manager

        def __call__(self, x):
            y = self.base(x)
            for adapter in self.manager.active:
                pair = adapter.layers.get(self.slot_path)
                if pair is not None:
                    a, b = pair
                    y = y + (adapter.scale * ((x @ a) @ b)).astype(x.dtype)
            return y

    return _Slot


def _dims(layer) -> tuple[int, int] | None:
    """(input, output) dims of a linear layer, or None for anything else."""
    import mlx.nn as nn

    if isinstance(layer, nn.QuantizedLinear):
        out_dims, packed = layer.weight.shape
        return packed * 32 // layer.bits, out_dims
    if isinstance(layer, nn.Linear):
        out_dims, in_dims = layer.weight.shape
        return in_dims, out_dims
    return None


class AdapterManager:
    def __init__(self, model):
        self.model = model  # the mlx-lm model (top level, as mlx-lm's tuner saves keys)
        self.mounted: dict[str, Adapter] = {}
        self.active: tuple[Adapter, ...] = ()  # read by every slot on each forward
        self.default: tuple[str, ...] = ()  # the set a request without `adapter` gets
        self._generation = 0
        self._slots: dict[str, Any] = {}  # module path -> its _Slot (a class made at run time)
        self._lock = threading.Lock()
        self._Slot = _slot_class()

    # -- any thread ------------------------------------------------------
    def ids(self) -> set[str]:
        with self._lock:
            return set(self.mounted)

    def describe(self) -> list[dict]:
        with self._lock:
            return [a.describe() for a in self.mounted.values()]

    def check(self, spec: tuple[str, ...] | None) -> None:
        """Refuse a request naming an adapter that is not mounted."""
        if not spec:
            return
        mounted = self.ids()
        unknown = [i for i in spec if i not in mounted]
        if unknown:
            have = ", ".join(sorted(mounted)) or "none are mounted"
            raise AdapterError(f"unknown adapter id '{unknown[0]}' (mounted: {have})")

    # -- engine thread ---------------------------------------------------
    def resolve(self, spec: tuple[str, ...] | None) -> tuple[Adapter, ...]:
        """The adapters a request runs with, as mounted now."""
        ids = self.default if spec is None else spec
        missing = [i for i in ids if i not in self.mounted]
        if missing:
            raise AdapterError(f"adapter '{missing[0]}' is no longer mounted")
        return tuple(self.mounted[i] for i in ids)

    @staticmethod
    def namespace(group: tuple[Adapter, ...]) -> str:
        """The prompt-cache namespace of an adapter set ("" for the base)."""
        return "+".join(f"{a.id}@{a.generation}" for a in group)

    def current(self, group: tuple[Adapter, ...]) -> bool:
        """Whether every adapter of `group` is still the one mounted under its id."""
        return all(self.mounted.get(a.id) is a for a in group)

    def activate(self, group: tuple[Adapter, ...]) -> None:
        self.active = group
        self._prune()

    def mount(self, adapter_id: str, path: str, make_default: bool = False) -> dict:
        import mlx.core as mx

        if not isinstance(adapter_id, str) or not ID_PATTERN.match(adapter_id) or adapter_id.lower() in RESERVED:
            raise AdapterError("adapter id must be 1-128 letters, digits, '.', '_' or '-' (not 'none' or "
                               "'base'), starting with a letter or digit")
        root = Path(path).expanduser()
        weights = root / "adapters.safetensors"
        if (root / TRAINING_MARKER).exists():
            raise AdapterError(f"{root} is still being trained, or its fine-tune stopped before it finished (its "
                               f"{TRAINING_MARKER} file says so); run the job again, or delete that file to mount "
                               "what it holds")
        if not weights.exists():
            raise AdapterError(f"{root} holds no adapters.safetensors")
        try:
            regular_file(weights, "adapter")  # mx.load opens by name: a FIFO would block the engine thread
        except PathRefused as exc:
            raise AdapterError(str(exc)) from None
        config = read_config(root)
        kind = config.get("fine_tune_type", "lora")
        if kind != "lora":
            raise AdapterError(f"{root} is a {kind!r} adapter; only LoRA adapters can be mounted")
        try:
            tensors = mx.load(str(weights))
        except Exception as exc:
            raise AdapterError(f"{weights} cannot be read: {exc}") from None
        if not isinstance(tensors, dict):  # mx.load answers a dict for a .safetensors file
            raise AdapterError(f"{weights} holds no named tensors")
        layers = self._validate(tensors, root)
        rank, scale = _lora_numbers(config, root / "adapter_config.json", next(iter(layers.values()))[0].shape[1])
        mx.eval([list(pair) for pair in layers.values()])
        self._generation += 1
        adapter = Adapter(adapter_id, str(root.resolve()), rank, scale, config.get("base_model") or config.get("model"),
                          self._generation, weights.stat().st_size, layers)
        for module_path in layers:
            self._wrap(module_path)
        with self._lock:
            old = self.mounted.get(adapter_id)
            self.mounted[adapter_id] = adapter
            if make_default:
                self.default = (adapter_id,)
        if old is not None:
            self._prune()
        return {"id": adapter_id, "mounted_layers": len(layers), "rank": rank, "scale": scale,
                "ram_bytes": adapter.ram_bytes, "path": adapter.path}

    def unmount(self, adapter_id: str) -> dict:
        with self._lock:
            adapter = self.mounted.pop(adapter_id, None)
            if adapter is None:
                raise AdapterNotMounted(f"adapter {adapter_id} not mounted")
            if adapter_id in self.default:
                self.default = ()
        self._prune()
        return {"id": adapter_id, "removed_layers": len(adapter.layers)}

    def base_only(self, fn):
        """Run `fn()` with no adapter active (embeddings use the base model)."""
        saved, self.active = self.active, ()
        try:
            return fn()
        finally:
            self.active = saved

    def _validate(self, tensors: dict, root: Path) -> dict[str, tuple]:
        modules = dict(self.model.named_modules())
        paths: dict[str, dict] = {}
        for key, value in tensors.items():
            module_path, _, leaf = key.rpartition(".")
            if leaf not in ("lora_a", "lora_b"):
                raise AdapterError(f"{root.name}: tensor {key} is not a LoRA weight (lora_a / lora_b)")
            paths.setdefault(module_path, {})[leaf] = value
        if not paths:
            raise AdapterError(f"{root.name}: adapters.safetensors holds no LoRA weights")
        layers = {}
        for module_path, pair in sorted(paths.items()):
            if set(pair) != {"lora_a", "lora_b"}:
                raise AdapterError(f"{root.name}: {module_path} has lora_a or lora_b but not both")
            target = modules.get(module_path)
            if isinstance(target, self._Slot):
                target = target.base
            dims = _dims(target) if target is not None else None
            if dims is None:
                what = "does not exist in" if target is None else "is not a linear layer of"
                raise AdapterError(f"{root.name}: {module_path} {what} the served model")
            a, b = pair["lora_a"], pair["lora_b"]
            in_dims, out_dims = dims
            if a.ndim != 2 or b.ndim != 2 or a.shape[0] != in_dims or b.shape[1] != out_dims \
                    or a.shape[1] != b.shape[0]:
                raise AdapterError(
                    f"{root.name}: {module_path} shapes lora_a {tuple(a.shape)} / lora_b {tuple(b.shape)} do not "
                    f"fit a {in_dims}->{out_dims} layer; was it trained on another base model?")
            layers[module_path] = (a, b)
        return layers

    def _wrap(self, module_path: str) -> None:
        from mlx.utils import tree_unflatten

        if module_path in self._slots:
            return
        base = dict(self.model.named_modules())[module_path]
        slot = self._Slot(base, module_path, self)
        self.model.update_modules(tree_unflatten([(module_path, slot)]))
        self._slots[module_path] = slot

    def _prune(self) -> None:
        """Give back the plain layers no mounted or running adapter needs."""
        from mlx.utils import tree_unflatten

        in_use = {p for a in (*self.mounted.values(), *self.active) for p in a.layers}
        for module_path in [p for p in self._slots if p not in in_use]:
            slot = self._slots.pop(module_path)
            self.model.update_modules(tree_unflatten([(module_path, slot.base)]))
