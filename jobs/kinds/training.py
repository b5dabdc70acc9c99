"""What the fine-tune kinds share: reading JSONL rows, chat examples
tokenized as serving renders them, the optimizer with its learning-rate
schedule, the trainers' arguments, and the loss reporter. SFT
(`finetune.py`) and DPO/ORPO (`preference.py`) both build on it, neither on
the other."""
from __future__ import annotations

import dataclasses
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path

from core.paths import open_regular
from jobs.events import EventLog


def read_jsonl(path: Path) -> list[dict]:
    return list(jsonl_rows(path))


# The longest row a dataset file may hold, in characters: a 128K-token conversation is about 0.5M. A pass over
# a file holds one row; without a bound, one file of a single endless line (inspect-dataset runs in the server)
# would be read whole into memory.
MAX_ROW_CHARS = 16 * 2**20


def jsonl_rows(path: Path) -> Iterator[dict]:
    """The rows of a JSONL file one at a time, so a pass over a large file holds one line (a
    ValueError names the line that is not JSON, or is over MAX_ROW_CHARS)."""
    with open_regular(path, path.name) as raw, io.TextIOWrapper(raw, encoding="utf-8") as f:
        n = 0
        while line := f.readline(MAX_ROW_CHARS + 2):  # the row, its line end, and one character more
            n += 1
            if len(line.rstrip("\r\n")) > MAX_ROW_CHARS:
                raise ValueError(f"{path.name} line {n} is over {MAX_ROW_CHARS // 2**20}M characters: "
                                 "one row of a dataset is one conversation")
            if line.strip():
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise ValueError(f"{path.name} line {n} is not JSON: {exc}") from None
                yield row


def learning_rate(cfg: dict):
    """The optimizer's learning rate: a number, or a warmup + cosine schedule."""
    import mlx.optimizers as optim

    lr, method = float(cfg["learning_rate"]), cfg["method"]
    shape = cfg.get(f"{method}_lr_schedule", "constant")
    # The optimizer steps once per `grad_accumulation_steps` iterations; schedules count its steps.
    accum = cfg["grad_accumulation_steps"]
    warmup = -(-cfg.get(f"{method}_warmup_iters", 0) // accum)
    updates = -(-cfg["iters"] // accum)
    if not warmup and shape == "constant":
        return lr
    main = optim.cosine_decay(lr, max(updates - warmup, 1)) if shape == "cosine" else (lambda step: lr)
    if not warmup:
        return main
    return optim.join_schedules([optim.linear_schedule(0.0, lr, warmup), main], [warmup])


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


def learns(ids: list[int], offset: int, limit: int) -> bool:
    """Whether an example (token ids, offset of its first trained token) keeps a token to learn once
    cut to `limit` tokens, as the trainers' batches cut it. A batch of examples without one divides
    its loss by zero, and that NaN ends up in every weight of the adapter."""
    return max(offset, 1) < min(len(ids), limit)


class Reporter:
    """The trainers' callback: each report becomes a `metric` event. A loss that is not a number
    fails the job there: the adapter it trains is NaN, and the job must not end `done`."""

    def __init__(self, log: EventLog, total: int):
        self.log, self.total = log, total

    EXTRA = ("chosen_reward", "rejected_reward", "accuracies", "margins")  # DPO / ORPO

    @staticmethod
    def _finite(loss: float, kind: str, step) -> float:
        if not math.isfinite(loss):
            raise ValueError(f"the {kind} loss became {loss} at step {step}: the adapter's weights are no longer "
                             "numbers; lower learning_rate, or check the rows for ones with nothing to learn")
        return loss

    def on_train_loss_report(self, info: dict) -> None:
        self._finite(float(info["train_loss"]), "training", info["iteration"])
        extra = {k: float(info[f"train_{k}"]) for k in self.EXTRA if f"train_{k}" in info}
        self.log.emit("metric", kind="train", step=info["iteration"], total_steps=self.total,
                      loss=float(info["train_loss"]), learning_rate=float(info["learning_rate"]),
                      tokens_per_sec=float(info["tokens_per_second"]),
                      trained_tokens=int(info.get("trained_tokens", 0)), **extra)

    def on_val_loss_report(self, info: dict) -> None:
        self._finite(float(info["val_loss"]), "validation", info["iteration"])
        extra = {k: float(info[f"val_{k}"]) for k in self.EXTRA if f"val_{k}" in info}
        self.log.emit("metric", kind="val", step=info["iteration"], total_steps=self.total,
                      loss=float(info["val_loss"]), **extra)


def training_args(cls, cfg: dict, adapter_path: Path, **extra):
    """mlx-lm's (or mlx-lm-lora's) TrainingArgs from the job config."""
    names = {f.name for f in dataclasses.fields(cls)}
    accum = "grad_accumulation_steps" if "grad_accumulation_steps" in names else "gradient_accumulation_steps"
    save_every = cfg["save_every"] if cfg["save_checkpoints"] else cfg["iters"] + 1
    return cls(batch_size=cfg["batch_size"], iters=cfg["iters"], val_batches=-1,
               steps_per_report=cfg["steps_per_report"], steps_per_eval=cfg["steps_per_eval"] or cfg["iters"],
               steps_per_save=save_every, adapter_file=str(adapter_path / "adapters.safetensors"),
               max_seq_length=cfg["max_seq_length"], grad_checkpoint=bool(cfg["grad_checkpoint"]),
               **{accum: cfg["grad_accumulation_steps"]}, **extra)


def optimizer(cfg: dict):
    import mlx.optimizers as optim

    lr = learning_rate(cfg)
    if cfg["weight_decay"]:
        return optim.AdamW(learning_rate=lr, weight_decay=float(cfg["weight_decay"]))
    return optim.Adam(learning_rate=lr)
