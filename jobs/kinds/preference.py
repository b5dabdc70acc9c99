"""DPO and ORPO on prompt/chosen/rejected rows, through mlx-lm-lora's
trainers. Imported only in a job's child process: mlx-lm-lora brings
`datasets` (and pandas, pyarrow) with it.

Both replies are rendered as serving renders a conversation (the prompt
with the template's generation prompt, then the reply as the template
closes it), and the loss covers the reply tokens only. DPO compares the
policy with a frozen copy of the base model."""
from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from jobs.kinds.training import learns


class PreferencePairs:
    """Items as mlx-lm-lora's batch iterators read them: the rows of the file `name` that give the
    trainer something to compare. A row whose chosen or rejected reply is empty, whose two replies
    are the same, or either of whose replies has no token within `limit` (the prompt fills
    max_seq_length) is left out and counted in the job's log: the last kind divides a batch's
    scores by zero tokens, the others teach nothing."""

    def __init__(self, rows: list[dict], hf_tokenizer, chat_dataset_cls, name: str, limit: int, log):
        render = chat_dataset_cls([], hf_tokenizer, True)
        self.items = []
        self.total = len(rows)
        self.dropped = {"empty": 0, "same": 0, "long": 0}
        for n, row in enumerate(rows, 1):
            for key in ("prompt", "chosen", "rejected"):
                if not isinstance(row.get(key), str) or (key == "prompt" and not row[key]):
                    raise ValueError(f"{name} row {n}: {key} must be a {'non-empty ' if key == 'prompt' else ''}"
                                     "string")
            if not row["chosen"].strip() or not row["rejected"].strip():
                self.dropped["empty"] += 1
                continue
            if row["chosen"].strip() == row["rejected"].strip():
                self.dropped["same"] += 1
                continue
            asked = ([{"role": "system", "content": row["system"]}] if isinstance(row.get("system"), str) else []) \
                + [{"role": "user", "content": row["prompt"]}]
            chosen, chosen_prompt = render.process(
                {"messages": asked + [{"role": "assistant", "content": row["chosen"]}]})
            rejected, rejected_prompt = render.process(
                {"messages": asked + [{"role": "assistant", "content": row["rejected"]}]})
            if not (learns(chosen, chosen_prompt, limit) and learns(rejected, rejected_prompt, limit)):
                self.dropped["long"] += 1
                continue
            self.items.append({"chosen": chosen, "rejected": rejected, "chosen_prompt_length": chosen_prompt,
                               "rejected_prompt_length": rejected_prompt,
                               "preference_score": float(row.get("preference_score", 1.0))})
        if sum(self.dropped.values()):
            log.emit("log", line=f"{self.total - len(self.items)} of {self.total} {name} rows are left out: "
                                 f"{self.why(limit)}")

    def why(self, limit: int) -> str:
        """What the rows left out hold, counted."""
        words = {"empty": "with an empty chosen or rejected reply", "same": "whose chosen and rejected replies "
                 "are the same", "long": f"with no chosen or rejected reply token within max_seq_length {limit}"}
        return ", ".join(f"{count} {words[key]}" for key, count in self.dropped.items() if count)

    def __getitem__(self, idx: int) -> dict:
        return self.items[idx]

    def __len__(self) -> int:
        return len(self.items)


def pairs(train_rows: list[dict], valid_rows: list[dict], hf_tokenizer, chat_dataset_cls, cfg: dict,
          log) -> tuple[PreferencePairs, PreferencePairs | None]:
    """The training and validation pairs; a ValueError naming train.jsonl and its counts when fewer
    rows than one batch are left. Too few validation rows skip validation."""
    limit, batch = cfg["max_seq_length"], cfg["batch_size"]
    rows_left = PreferencePairs(train_rows, hf_tokenizer, chat_dataset_cls, "train.jsonl", limit, log)
    if len(rows_left) < batch:
        found = f"only {len(rows_left)} of {rows_left.total} train.jsonl rows are" if len(rows_left) \
            else f"none of the {rows_left.total} train.jsonl rows is"
        hint = "; raise max_seq_length" if rows_left.dropped["long"] else ""
        raise ValueError(f"{found} usable, fewer than batch_size {batch} ({rows_left.why(limit)}){hint}")
    valid = None
    if valid_rows:
        valid = PreferencePairs(valid_rows, hf_tokenizer, chat_dataset_cls, "valid.jsonl", limit, log)
        if len(valid) < batch:
            log.emit("log", line=f"valid.jsonl has {len(valid)} usable rows, fewer than batch_size {batch}: "
                                 "validation is skipped")
            valid = None
    return rows_left, valid


def _cpu_device_info() -> None:
    """mlx-lm-lora sizes MLX's wired memory from a Metal-only device field;
    the CPU build has none (and nothing to wire)."""
    import mlx.core as mx

    info = mx.device_info()
    if "max_recommended_working_set_size" not in info:
        mx.device_info = lambda d=None: {**info, "max_recommended_working_set_size": 0}


def train(model, model_dir: str, hf_tokenizer, cfg: dict, train_rows: list[dict], valid_rows: list[dict],
          adapter_path: Path, reporter, chat_dataset_cls) -> None:
    from mlx_lm import load

    from jobs.kinds.training import optimizer, training_args

    _cpu_device_info()
    train_set, valid_set = pairs(train_rows, valid_rows, hf_tokenizer, chat_dataset_cls, cfg, reporter.log)
    if cfg["method"] == "dpo":
        from mlx_lm_lora.trainer.dpo_trainer import DPOTrainingArgs, train_dpo

        # Typed as a union of the 2- and 3-tuple; without return_config it answers the 2-tuple.
        reference, _ = cast("tuple[Any, Any]", load(model_dir))
        reference.freeze()
        args = training_args(DPOTrainingArgs, cfg, adapter_path, beta=float(cfg["dpo_beta"]), loss_type="sigmoid")
        train_dpo(model, reference, optimizer(cfg), train_set, valid_set, args=args, training_callback=reporter,
                  loss_type="sigmoid")
    else:
        from mlx_lm_lora.trainer.orpo_trainer import ORPOTrainingArgs, train_orpo

        args = training_args(ORPOTrainingArgs, cfg, adapter_path, beta=float(cfg["orpo_lambda"]))
        train_orpo(model, optimizer(cfg), train_set, valid_set, args=args, training_callback=reporter)
