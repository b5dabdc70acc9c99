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


class PreferencePairs:
    """Items as mlx-lm-lora's batch iterators read them."""

    def __init__(self, rows: list[dict], hf_tokenizer, chat_dataset_cls):
        render = chat_dataset_cls([], hf_tokenizer, True)
        self.items = []
        for n, row in enumerate(rows, 1):
            for key in ("prompt", "chosen", "rejected"):
                if not isinstance(row.get(key), str) or not row[key]:
                    raise ValueError(f"preference row {n}: {key} must be a non-empty string")
            asked = ([{"role": "system", "content": row["system"]}] if isinstance(row.get("system"), str) else []) \
                + [{"role": "user", "content": row["prompt"]}]
            chosen, chosen_prompt = render.process(
                {"messages": asked + [{"role": "assistant", "content": row["chosen"]}]})
            rejected, rejected_prompt = render.process(
                {"messages": asked + [{"role": "assistant", "content": row["rejected"]}]})
            self.items.append({"chosen": chosen, "rejected": rejected, "chosen_prompt_length": chosen_prompt,
                               "rejected_prompt_length": rejected_prompt,
                               "preference_score": float(row.get("preference_score", 1.0))})

    def __getitem__(self, idx: int) -> dict:
        return self.items[idx]

    def __len__(self) -> int:
        return len(self.items)


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
    train_set = PreferencePairs(train_rows, hf_tokenizer, chat_dataset_cls)
    valid_set = PreferencePairs(valid_rows, hf_tokenizer, chat_dataset_cls) if valid_rows else None
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
