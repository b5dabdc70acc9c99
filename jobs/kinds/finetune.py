"""LoRA fine-tuning with mlx-lm's tuner (SFT) or mlx-lm-lora's trainers
(DPO, ORPO), reporting loss as it trains.

Data: `train.jsonl` (and optionally `valid.jsonl`) in `data_dir`, one
example per line. SFT takes `{"messages": [...]}`, `{"prompt",
"completion"}` or `{"text"}`; DPO and ORPO take `{"prompt", "chosen",
"rejected"}` (optionally `system`). Chat examples are rendered with the
Hugging Face tokenizer's own template, exactly as serving renders them."""
from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from core.paths import (
    ADAPTER_FILES,
    CONFIG_BEFORE,
    TRAINING_MARKER,
    PathRefused,
    confine,
    confine_members,
    confine_model_ref,
    holds_a_root,
    read_json,
    regular_entries,
    regular_file,
)
from jobs.events import EventLog
from jobs.kinds.training import (
    Reporter,
    ServingChatDataset,
    jsonl_rows,
    learns,
    optimizer,
    read_jsonl,
    training_args,
)


def _knob(default, doc: str):
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Options:
    """Every setting a fine-tune takes besides its paths, at the value a job
    runs with when its config leaves it out (or sets it to null). `settings`
    checks them when the job starts; the submit body's Schema
    (`jobs.api_bodies.FinetuneRequest`) is built from these fields."""

    method: str = _knob("sft", "sft, dpo or orpo")
    iters: int = 300
    learning_rate: float = 2e-4
    rank: int = 16
    scale: float = 20.0
    lora_dropout: float = 0.0
    num_layers: int = _knob(0, "0 = every layer")
    batch_size: int = 1
    max_seq_length: int = 2048
    grad_accumulation_steps: int = 1
    seed: int = 0
    steps_per_report: int = 1
    steps_per_eval: int = 0
    sft_scope: str = _knob("full", "full or response")
    save_every: int = _knob(100, "steps between checkpoints")
    save_checkpoints: bool = _knob(True, "false: only the final adapter is written")
    weight_decay: float = _knob(0.0, "above 0: AdamW instead of Adam")
    grad_checkpoint: bool = _knob(False, "recompute activations in the backward pass (less memory, slower)")
    target_modules: list[str] | None = _knob(None, 'layer names, e.g. ["self_attn.q_proj"]; default: '
                                                   "mlx-lm's choice")
    val_max_examples: int = _knob(0, "0 = every row of valid.jsonl")
    warm_start_adapter: str | None = _knob(None, "an adapter folder to continue from")
    dpo_beta: float = 0.1
    dpo_warmup_iters: int = _knob(0, "DPO: steps of linear learning-rate warmup")
    dpo_lr_schedule: str = _knob("constant", "DPO: constant or cosine")
    orpo_lambda: float = 0.1
    orpo_warmup_iters: int = _knob(0, "ORPO: steps of linear learning-rate warmup")
    orpo_lr_schedule: str = _knob("constant", "ORPO: constant or cosine")


DEFAULTS = asdict(Options())

# Config keys other MLX LoRA trainers take and this one does not offer: gradient clipping, rsLoRA and
# LoRA+ scaling, MLP and sequence splitting, ORPO's chunked and fused losses. The submit route refuses
# them (and any other key) with a 400 that names the field; a job whose config holds one fails, naming it.
PATHS = ("model_dir", "data_dir", "adapter_path")
UNSUPPORTED = ("grad_clip_norm", "rank_scaling", "rs_lora", "lora_plus_ratio", "mlp_split", "segment_size",
               "orpo_chunk_size", "orpo_fused_ce", "orpo_flash_ce", "orpo_prefix_shared")
METHODS = ("sft", "dpo", "orpo")
FORMATS = {"messages": "messages", "prompt": "prompt-completion", "text": "text", "chosen": "dpo"}


DATA_FILES = ("train.jsonl", "valid.jsonl")


def confine_paths(config: dict) -> None:
    """Every path a fine-tune names must be inside the allowed roots (see
    core.paths); checked when the job is submitted and again in its child."""
    data = confine(config.get("data_dir"), "data_dir")
    confine_members(data, DATA_FILES, "data_dir")
    if isinstance(config.get("model_dir"), str):
        _model_files(confine_model_ref(config["model_dir"], "model_dir"))
    adapter = confine(config.get("adapter_path"), "adapter_path")
    if holds_a_root(adapter):
        raise PathRefused("adapter_path must be a folder of its own, not HEARTH_HOME, the cache or a folder above them")
    start = config.get("warm_start_adapter")
    if isinstance(start, str) and start:
        start = confine(start, "warm_start_adapter")
        confine_members(start if start.is_dir() else start.parent, ADAPTER_FILES, "warm_start_adapter")


def _model_files(ref: str) -> None:
    """The model folder the trainer loads holds no FIFO, device or socket:
    mlx-lm and the tokenizer open its files by name. A model that is not
    on this machine is left for the job to report."""
    from inference.engine.errors import ModelNotFound
    from inference.engine.loader import resolve

    folder = Path(ref)
    if not folder.is_dir():
        try:
            _, folder = resolve(ref)
        except ModelNotFound:
            return
    regular_entries(folder, "model_dir")


def data_format(rows: list[dict]) -> str:
    if not rows or not isinstance(rows[0], dict):
        return "unknown"
    first = rows[0]
    if "chosen" in first and "rejected" in first:
        return "dpo"
    if "prompt" in first and "completion" in first:
        return "prompt-completion"
    for key, name in FORMATS.items():
        if key in first:
            return name
    return "unknown"


# The fields each format needs in every row, and how a person names the format.
NEEDS = {"messages": ("messages",), "prompt-completion": ("prompt", "completion"), "text": ("text",),
         "dpo": ("prompt", "chosen", "rejected")}
FORMAT_NAMES = {"messages": "chat messages", "prompt-completion": "prompt/completion", "text": "text",
                "dpo": "prompt/chosen/rejected"}


def rows_format(rows: Iterable, name: str) -> str:
    """The format every row of the file `name` is in (the first row's); a ValueError that names
    the file, the row and what it holds when the file is empty, the first row is in no format
    the trainers know, or a later row lacks what the first row's format needs."""
    return checked_rows(rows, name)[0]


def checked_rows(rows: Iterable, name: str, needed: bool = True) -> tuple[str, int]:
    """`rows_format` of rows read one at a time (a file's `jsonl_rows`), and how many there are;
    ("unknown", 0) for no rows when they are not `needed`."""
    fmt, count = "unknown", 0
    for count, row in enumerate(rows, 1):
        if count == 1:
            fmt = data_format([row])
            if fmt == "unknown":
                held = ", ".join(sorted(map(str, row))) or "no fields" if isinstance(row, dict) else "not an object"
                raise ValueError(f"{name} row 1 has {held}: rows must be messages, prompt/completion or text (SFT) "
                                 "or prompt/chosen/rejected (DPO, ORPO); the Dataset page's CSV / JSONL template "
                                 "converts other columns")
        missing = [key for key in NEEDS[fmt] if not isinstance(row, dict) or not _usable(key, row.get(key))]
        if missing:
            raise ValueError(f"{name} row {count} has no usable {missing[0]!r}: every row must be "
                             f"{FORMAT_NAMES[fmt]} like row 1")
    if not count and needed:
        raise ValueError(f"{name} has no rows")
    return fmt, count


def _usable(key: str, value: Any) -> bool:
    if key == "messages":
        return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)
    if key in ("chosen", "rejected"):
        return value is not None
    return isinstance(value, str) and bool(value or key != "text")  # an empty text has no token to learn


def inspect(data_dir: str) -> dict:
    """What a dataset folder holds; `data_dir` is already confined (core.paths). FileNotFoundError
    without a train.jsonl, ValueError when its rows cannot be read or cannot be trained on. One pass
    over each file, a row at a time: a file of any size is checked in the memory of its longest row."""
    root = Path(data_dir)
    confine_members(root, DATA_FILES, "path")
    if not (root / "train.jsonl").is_file():
        raise FileNotFoundError(f"{root / 'train.jsonl'} not found")
    fmt, n_train = checked_rows(jsonl_rows(root / "train.jsonl"), "train.jsonl")
    n_valid = 0
    if (root / "valid.jsonl").is_file():  # an empty one is none, as the trainer reads it
        valid_fmt, n_valid = checked_rows(jsonl_rows(root / "valid.jsonl"), "valid.jsonl", needed=False)
        if n_valid:
            _same_format(fmt, valid_fmt)
    return {"ok": True, "n_train": n_train, "n_valid": n_valid, "format": fmt}


def _dataset(root: Path) -> tuple[list, list]:
    """The rows of train.jsonl and valid.jsonl (none without one), each file in one format, the
    same in both (rows_format)."""
    train_rows = read_jsonl(root / "train.jsonl")
    valid_rows = read_jsonl(root / "valid.jsonl") if (root / "valid.jsonl").is_file() else []
    fmt = rows_format(train_rows, "train.jsonl")
    if valid_rows:
        _same_format(fmt, rows_format(valid_rows, "valid.jsonl"))
    return train_rows, valid_rows


def _same_format(train: str, valid: str) -> None:
    if valid != train:
        raise ValueError(f"valid.jsonl rows are {FORMAT_NAMES[valid]}, train.jsonl's {FORMAT_NAMES[train]}: "
                         "both files need the same format")


def settings(config: dict) -> dict:
    unknown = sorted(set(config) - set(DEFAULTS) - set(PATHS))
    if unknown:
        why = "not offered by this trainer" if unknown[0] in UNSUPPORTED else "not a fine-tune setting"
        raise ValueError(f"{unknown[0]}: {why} (the settings are those of POST /api/finetune/submit)")
    cfg = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    if cfg["method"] not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {cfg['method']!r}")
    if cfg["sft_scope"] not in ("full", "response"):
        raise ValueError("sft_scope must be 'full' or 'response'")
    for name in ("rank", "iters", "batch_size", "max_seq_length", "steps_per_report", "grad_accumulation_steps",
                 "save_every"):
        if not isinstance(cfg[name], int) or isinstance(cfg[name], bool) or cfg[name] < 1:
            raise ValueError(f"{name} must be a positive integer")
    if cfg["max_seq_length"] < 2:
        raise ValueError("max_seq_length must be at least 2: a token and the one after it, which it learns to predict")
    for name in ("num_layers", "steps_per_eval", "val_max_examples", "seed", "dpo_warmup_iters", "orpo_warmup_iters"):
        if not isinstance(cfg[name], int) or isinstance(cfg[name], bool) or cfg[name] < 0:
            raise ValueError(f"{name} must be a non-negative integer")
    for name in ("learning_rate", "scale", "lora_dropout", "weight_decay", "dpo_beta",
                 "orpo_lambda"):
        if not isinstance(cfg[name], (int, float)) or isinstance(cfg[name], bool) or cfg[name] < 0:
            raise ValueError(f"{name} must be a non-negative number")
    for name in ("dpo_lr_schedule", "orpo_lr_schedule"):
        if cfg[name] not in ("constant", "cosine"):
            raise ValueError(f"{name} must be 'constant' or 'cosine'")
    modules = cfg["target_modules"]
    if modules is not None and (not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules)):
        raise ValueError("target_modules must be a list of layer names, e.g. [\"self_attn.q_proj\"]")
    if cfg["warm_start_adapter"] is not None and not isinstance(cfg["warm_start_adapter"], str):
        raise ValueError("warm_start_adapter must be a path")
    return cfg


def run(config: dict, log: EventLog, stage_delay: float = 0.0) -> tuple[str, dict]:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from inference.engine.loader import resolve

    cfg = settings(config)
    confine_paths(cfg)
    adapter_path = Path(cfg["adapter_path"]).expanduser()
    _, model_dir = resolve(cfg["model_dir"])
    log.emit("stage", stage="load", progress=0.02, message=f"loading {model_dir.name}")
    # Typed as a union of the 2- and 3-tuple; without return_config it answers the 2-tuple.
    model, wrapper = cast("tuple[Any, Any]", load(str(model_dir)))
    hf_tokenizer = getattr(wrapper, "_tokenizer", wrapper)  # the template serving uses, as is

    log.emit("stage", stage="data", progress=0.05, message=f"reading {cfg['data_dir']}")
    train_rows, valid_rows = _dataset(Path(cfg["data_dir"]).expanduser())
    fmt = data_format(train_rows)
    method = cfg["method"]
    if method == "sft" and fmt == "dpo":
        raise ValueError(f"train.jsonl is {fmt} data; SFT needs messages, prompt/completion or text rows")
    if method != "sft" and fmt != "dpo":
        raise ValueError(f"train.jsonl is {fmt} data; {method.upper()} needs prompt/chosen/rejected rows")
    if len(train_rows) < cfg["batch_size"]:
        raise ValueError(f"train.jsonl has {len(train_rows)} rows, fewer than batch_size {cfg['batch_size']}")
    if cfg["val_max_examples"]:
        valid_rows = valid_rows[:cfg["val_max_examples"]]
    if valid_rows and len(valid_rows) < cfg["batch_size"]:
        log.emit("log", line=f"valid.jsonl has {len(valid_rows)} rows, fewer than batch_size "
                             f"{cfg['batch_size']}: validation is skipped")
        valid_rows = []

    mx.random.seed(cfg["seed"])
    model.freeze()
    layers = cfg["num_layers"] or len(model.layers)
    lora = {"rank": cfg["rank"], "scale": float(cfg["scale"]), "dropout": float(cfg["lora_dropout"])}
    if cfg["target_modules"]:
        lora["keys"] = cfg["target_modules"]
    start = _warm_start(cfg, lora, log)
    if start is not None:
        layers = start[1] or layers
    linear_to_lora_layers(model, layers, lora)
    if start is not None:
        _load_warm_start(model, start[0])
        log.emit("log", line=f"warm start from {start[0]}")
    adapter_path.mkdir(parents=True, exist_ok=True)
    # Until training ends the folder holds checkpoints at best: nothing lists or mounts it.
    (adapter_path / TRAINING_MARKER).write_text(json.dumps({"pid": os.getpid(), "started_at": time.time()}))
    if (adapter_path / "adapter_config.json").is_file():  # an adapter trained here before (jobs/leftovers.py)
        shutil.copy2(adapter_path / "adapter_config.json", adapter_path / CONFIG_BEFORE)
    (adapter_path / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": layers, "lora_parameters": lora, "base_model": str(model_dir),
        "method": method, "sft_scope": cfg["sft_scope"], "iters": cfg["iters"], "format": fmt,
        "created_at": time.time()}, indent=2))
    log.emit("stage", stage="train", progress=0.08,
             message=f"training {cfg['iters']} steps ({method}), rank {cfg['rank']}")
    if stage_delay:
        time.sleep(stage_delay)

    reporter = Reporter(log, cfg["iters"])
    if method == "sft":
        _train_sft(model, hf_tokenizer, cfg, fmt, train_rows, valid_rows, adapter_path, reporter)
    else:
        from jobs.kinds import preference

        preference.train(model, str(model_dir), hf_tokenizer, cfg, train_rows, valid_rows, adapter_path, reporter,
                         ServingChatDataset)
    _finite_weights(adapter_path / "adapters.safetensors")
    (adapter_path / CONFIG_BEFORE).unlink(missing_ok=True)
    (adapter_path / TRAINING_MARKER).unlink(missing_ok=True)
    return str(adapter_path), {"method": method, "format": fmt, "iters": cfg["iters"], "n_train": len(train_rows),
                               "n_valid": len(valid_rows), "rank": lora["rank"], "base_model": str(model_dir)}


def _finite_weights(weights: Path) -> None:
    """The trained adapter holds numbers only. The reporter fails a job whose reported loss is not a
    number; this also holds when a step between two reports went wrong."""
    import mlx.core as mx

    # A safetensors file loads as a dict of arrays.
    for name, value in cast("dict[str, mx.array]", mx.load(str(weights))).items():
        if not bool(mx.isfinite(value).all()):
            raise ValueError(f"the trained adapter's {name} holds values that are not numbers: lower learning_rate")


def _warm_start(cfg: dict, lora: dict, log: EventLog) -> tuple[Path, int] | None:
    """The adapter to continue from and its layer count; its rank, scale
    and target modules replace the job's, so its weights fit."""
    if not cfg["warm_start_adapter"]:
        return None
    start = Path(cfg["warm_start_adapter"]).expanduser()
    weights = start / "adapters.safetensors" if start.is_dir() else start
    if not weights.exists():
        raise ValueError(f"warm_start_adapter: {weights} not found")
    regular_file(weights, "warm_start_adapter")  # mx.load opens it by name
    try:
        config = read_json(weights.parent / "adapter_config.json", "warm_start_adapter")
        params = config["lora_parameters"]
        lora.update(rank=int(params["rank"]), scale=float(params["scale"]))
    except PathRefused:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"warm_start_adapter: {weights.parent} has no usable adapter_config.json ({exc})") from None
    if params.get("keys"):
        lora["keys"] = params["keys"]
    if (lora["rank"], lora["scale"]) != (cfg["rank"], float(cfg["scale"])):
        log.emit("log", line=f"warm start: using the adapter's rank {lora['rank']} and scale {lora['scale']}")
    return weights, int(config.get("num_layers") or 0)


def _load_warm_start(model, weights: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    # Without a destination, tree_flatten answers a list of (path, leaf).
    wanted = dict(cast("list[tuple[str, Any]]", tree_flatten(model.trainable_parameters())))
    regular_file(weights, "warm_start_adapter")
    # An adapter's weights are a safetensors file (ADAPTER_FILES), which loads as a dict of arrays.
    found = cast("dict[str, mx.array]", mx.load(str(weights)))
    missing, extra = set(wanted) - set(found), set(found) - set(wanted)
    if missing or extra:
        name = sorted(missing or extra)[0]
        raise ValueError(f"warm_start_adapter does not fit this model: {len(missing)} LoRA weights missing, "
                         f"{len(extra)} unexpected (e.g. {name})")
    for key, value in found.items():
        if value.shape != wanted[key].shape:
            raise ValueError(f"warm_start_adapter: {key} is {tuple(value.shape)}, the model needs "
                             f"{tuple(wanted[key].shape)}")
    model.load_weights(list(found.items()), strict=False)


def _train_sft(model, hf_tokenizer, cfg, fmt, train_rows, valid_rows, adapter_path, reporter) -> None:
    from mlx_lm.tuner.datasets import CacheDataset, create_dataset
    from mlx_lm.tuner.trainer import TrainingArgs, train

    class DataConfig:
        mask_prompt = cfg["sft_scope"] == "response"

    def dataset(rows):
        if fmt == "prompt-completion":  # a one-turn chat, rendered as serving renders it
            rows = [{"messages": [{"role": "user", "content": row["prompt"]},
                                  {"role": "assistant", "content": row["completion"]}], "tools": row.get("tools")}
                    for row in rows]
        if fmt in ("messages", "prompt-completion"):
            return CacheDataset(ServingChatDataset(rows, hf_tokenizer, DataConfig.mask_prompt))
        return CacheDataset(create_dataset(rows, hf_tokenizer, DataConfig))

    limit, scope = cfg["max_seq_length"], cfg["sft_scope"]
    train_set = _trainable(dataset(train_rows), "train.jsonl", limit, scope, reporter.log)
    if len(train_set) < cfg["batch_size"]:
        what = "a reply token" if scope == "response" else "two tokens"
        found = f"only {len(train_set)} train.jsonl rows have" if train_set else "no train.jsonl row has"
        fewer = f", fewer than batch_size {cfg['batch_size']}" if train_set else ""
        raise ValueError(f"{found} {what} within max_seq_length {limit}{fewer}: raise max_seq_length"
                         + (" or train on the whole example (sft_scope full)" if scope == "response" else ""))
    val_set = _trainable(dataset(valid_rows), "valid.jsonl", limit, scope, reporter.log) if valid_rows else []
    if val_set and len(val_set) < cfg["batch_size"]:
        reporter.log.emit("log", line=f"valid.jsonl has {len(val_set)} such rows, fewer than batch_size "
                                      f"{cfg['batch_size']}: validation is skipped")
        val_set = []
    args = training_args(TrainingArgs, cfg, adapter_path)
    train(model=model, optimizer=optimizer(cfg), train_dataset=train_set, val_dataset=val_set or None, args=args,
          training_callback=reporter)


def _trainable(examples, name: str, limit: int, scope: str, log: EventLog) -> list[tuple[list[int], int]]:
    """The tokenized examples (ids, offset of the first trained token) that keep a token to learn
    once cut to `limit` tokens (`learns`)."""
    kept = []
    for i in range(len(examples)):
        ids, offset = examples[i]
        if learns(ids, offset, limit):
            kept.append((ids, offset))
    if dropped := len(examples) - len(kept):
        where = "reply" if scope == "response" else "second token"
        log.emit("log", line=f"{dropped} of {len(examples)} {name} rows have no {where} within max_seq_length "
                             f"{limit}: they are left out")
    return kept
