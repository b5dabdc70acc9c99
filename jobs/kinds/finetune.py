"""LoRA fine-tuning (SFT) with mlx-lm's tuner, reporting loss as it trains.

Data: `train.jsonl` (and optionally `valid.jsonl`) in `data_dir`, one
example per line as `{"messages": [...]}`, `{"prompt", "completion"}` or
`{"text"}`. Chat examples are rendered with the Hugging Face tokenizer's
own template, exactly as serving renders them."""
from __future__ import annotations

import json
import time
from pathlib import Path

from jobs.events import EventLog

DEFAULTS = {"method": "sft", "rank": 16, "scale": 20.0, "lora_dropout": 0.0, "num_layers": 0, "iters": 300,
            "learning_rate": 2e-4, "max_seq_length": 2048, "batch_size": 1, "grad_accumulation_steps": 1,
            "seed": 0, "steps_per_report": 1, "steps_per_eval": 0, "sft_scope": "full", "save_every": 100}
FORMATS = {"messages": "messages", "prompt": "prompt-completion", "text": "text", "chosen": "dpo"}


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as exc:
                    raise ValueError(f"{path.name} line {n} is not JSON: {exc}") from None
    return rows


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


def inspect(data_dir: str) -> dict:
    root = Path(data_dir).expanduser()
    train, valid = root / "train.jsonl", root / "valid.jsonl"
    if not train.is_file():
        return {"ok": False, "error": f"{train} not found"}
    try:
        rows = read_jsonl(train)
        n_valid = len(read_jsonl(valid)) if valid.is_file() else 0
    except ValueError as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True, "n_train": len(rows), "n_valid": n_valid, "format": data_format(rows)}


def settings(config: dict) -> dict:
    cfg = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    if cfg["method"] != "sft":
        raise ValueError(f"method {cfg['method']!r} is not available yet; use 'sft'")
    if cfg["sft_scope"] not in ("full", "response"):
        raise ValueError("sft_scope must be 'full' or 'response'")
    for name in ("rank", "iters", "batch_size", "max_seq_length", "steps_per_report", "grad_accumulation_steps"):
        if not isinstance(cfg[name], int) or cfg[name] < 1:
            raise ValueError(f"{name} must be a positive integer")
    return cfg


class ServingChatDataset:
    """Chat examples tokenized as serving will see them: the prompt is the
    template's rendering of every turn but the last with the generation
    prompt (templates may add to it, e.g. an empty think block), then the
    last assistant turn as the template closes it. `response` scope trains
    on that reply only."""

    def __init__(self, rows: list[dict], tokenizer, response_only: bool):
        self._data, self.tokenizer, self.response_only = rows, tokenizer, response_only

    def process(self, row: dict):
        messages, tools = row["messages"], row.get("tools")
        tok = self.tokenizer
        if not messages or messages[-1].get("role") != "assistant" or not isinstance(messages[-1].get("content"),
                                                                                       str):
            ids = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
            return ids, 0
        prompt = tok.apply_chat_template(messages[:-1], tools=tools, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(messages, tools=tools, tokenize=False)
        reply = messages[-1]["content"]
        at = full.rfind(reply) if reply else -1
        tail = full[at:] if at >= 0 else reply  # the reply plus the template's end-of-turn markup
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        ids = prompt_ids + tok.encode(tail, add_special_tokens=False)
        return ids, len(prompt_ids) if self.response_only else 0

    def __getitem__(self, idx: int):
        return self._data[idx]

    def __len__(self):
        return len(self._data)


class _Reporter:
    def __init__(self, log: EventLog, total: int):
        self.log, self.total = log, total

    def on_train_loss_report(self, info: dict) -> None:
        self.log.emit("metric", kind="train", step=info["iteration"], total_steps=self.total,
                      loss=float(info["train_loss"]), learning_rate=float(info["learning_rate"]),
                      tokens_per_sec=float(info["tokens_per_second"]),
                      trained_tokens=int(info.get("trained_tokens", 0)))

    def on_val_loss_report(self, info: dict) -> None:
        self.log.emit("metric", kind="val", step=info["iteration"], total_steps=self.total,
                      loss=float(info["val_loss"]))


def run(config: dict, log: EventLog, stage_delay: float = 0.0) -> tuple[str, dict]:
    import mlx.core as mx
    import mlx.optimizers as optim
    from mlx_lm import load
    from mlx_lm.tuner.datasets import CacheDataset, create_dataset
    from mlx_lm.tuner.trainer import TrainingArgs, train
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from inference.engine.loader import resolve

    cfg = settings(config)
    adapter_path = Path(cfg["adapter_path"]).expanduser()
    _, model_dir = resolve(cfg["model_dir"])
    log.emit("stage", stage="load", progress=0.02, message=f"loading {model_dir.name}")
    model, wrapper = load(str(model_dir))
    hf_tokenizer = getattr(wrapper, "_tokenizer", wrapper)  # the template serving uses, as is

    log.emit("stage", stage="data", progress=0.05, message=f"reading {cfg['data_dir']}")
    root = Path(cfg["data_dir"]).expanduser()
    train_rows = read_jsonl(root / "train.jsonl")
    valid_rows = read_jsonl(root / "valid.jsonl") if (root / "valid.jsonl").is_file() else []
    fmt = data_format(train_rows)
    if fmt in ("unknown", "dpo"):
        raise ValueError(f"train.jsonl is {fmt} data; SFT needs messages, prompt/completion or text rows")
    if len(train_rows) < cfg["batch_size"]:
        raise ValueError(f"train.jsonl has {len(train_rows)} rows, fewer than batch_size {cfg['batch_size']}")

    class DataConfig:
        mask_prompt = cfg["sft_scope"] == "response"

    if valid_rows and len(valid_rows) < cfg["batch_size"]:
        log.emit("log", line=f"valid.jsonl has {len(valid_rows)} rows, fewer than batch_size "
                             f"{cfg['batch_size']}: validation is skipped")
        valid_rows = []
    def dataset(rows):
        if fmt == "messages":
            return CacheDataset(ServingChatDataset(rows, hf_tokenizer, DataConfig.mask_prompt))
        return CacheDataset(create_dataset(rows, hf_tokenizer, DataConfig))

    train_set = dataset(train_rows)
    valid_set = dataset(valid_rows) if valid_rows else None

    mx.random.seed(cfg["seed"])
    model.freeze()
    layers = cfg["num_layers"] or len(model.layers)
    lora = {"rank": cfg["rank"], "scale": float(cfg["scale"]), "dropout": float(cfg["lora_dropout"])}
    linear_to_lora_layers(model, layers, lora)
    adapter_path.mkdir(parents=True, exist_ok=True)
    (adapter_path / "adapter_config.json").write_text(json.dumps({
        "fine_tune_type": "lora", "num_layers": layers, "lora_parameters": lora, "base_model": str(model_dir),
        "method": "sft", "sft_scope": cfg["sft_scope"], "iters": cfg["iters"], "format": fmt,
        "created_at": time.time()}, indent=2))
    log.emit("stage", stage="train", progress=0.08, message=f"training {cfg['iters']} steps, rank {cfg['rank']}")
    if stage_delay:
        time.sleep(stage_delay)

    eval_every = cfg["steps_per_eval"] or cfg["iters"]
    args = TrainingArgs(batch_size=cfg["batch_size"], iters=cfg["iters"], val_batches=-1,
                        steps_per_report=cfg["steps_per_report"], steps_per_eval=eval_every,
                        steps_per_save=cfg["save_every"], adapter_file=str(adapter_path / "adapters.safetensors"),
                        max_seq_length=cfg["max_seq_length"], grad_accumulation_steps=cfg["grad_accumulation_steps"])
    reporter = _Reporter(log, cfg["iters"])
    train(model=model, optimizer=optim.Adam(learning_rate=float(cfg["learning_rate"])), train_dataset=train_set,
          val_dataset=valid_set, args=args, training_callback=reporter)
    return str(adapter_path), {"method": "sft", "format": fmt, "iters": cfg["iters"], "n_train": len(train_rows),
                               "n_valid": len(valid_rows), "rank": cfg["rank"], "base_model": str(model_dir)}
