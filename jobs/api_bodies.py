"""The request bodies of the job routes on `/api` as django-ninja Schemas.

`Documented` ones describe a body the route reads and checks itself (its
messages are the ones the dashboard and scripts know, and quantize and
fine-tune pass the whole body on to the job); they allow fields they do not
list. The others are the routes' own parameters: ninja validates them, and
a refusal reads `{"ok": false, "error": "<field>: <reason>"}`."""
from __future__ import annotations

from typing import Any

from ninja import Schema
from pydantic import ConfigDict, Field


class Documented(Schema):
    model_config = ConfigDict(extra="allow")


class ModelRef(Documented):
    model_id: str = Field(..., description="a repo id in the HF cache, or a model folder")


class QuantizeRequest(ModelRef):
    bits: int = Field(4, description="2, 3, 4, 5, 6 or 8")
    group_size: int = Field(64, description="32, 64 or 128")
    target_bpw: float | None = Field(None, description="mixed precision: bits per weight, 1.5 to 16")
    candidate_bits: list[int] | None = Field(None, description="widths the mixed mode may pick from")


class FinetuneRequest(Documented):
    """A LoRA fine-tune; the numbers are checked when the job starts (a bad one fails the job)."""

    model_dir: str = Field(..., description="a repo id in the HF cache, or a model folder")
    data_dir: str = Field(..., description="a folder with train.jsonl and optionally valid.jsonl")
    adapter_path: str | None = Field(None, description="where the adapter is written; default under "
                                                       "HEARTH_HOME/adapters")
    method: str = Field("sft", description="sft, dpo or orpo")
    iters: int = 300
    learning_rate: float = 2e-4
    rank: int = 16
    scale: float = 20.0
    lora_dropout: float = 0.0
    num_layers: int = Field(0, description="0 = every layer")
    batch_size: int = 1
    max_seq_length: int = 2048
    grad_accumulation_steps: int = 1
    seed: int = 0
    steps_per_report: int = 1
    steps_per_eval: int = 0
    sft_scope: str = Field("full", description="full or response")
    save_every: int = 100
    weight_decay: float = 0.0
    target_modules: list[str] | None = Field(None, description='layer names, e.g. ["self_attn.q_proj"]')
    val_max_examples: int = 0
    warm_start_adapter: str | None = Field(None, description="an adapter folder to continue from")
    dpo_beta: float = 0.1
    orpo_lambda: float = 0.1


class MergeRequest(Documented):
    adapter_a: str = Field(..., description="an adapter folder")
    adapter_b: str = Field(..., description="an adapter folder")
    scales: list[float] | None = Field(None, description="two numbers; default: each adapter's own scale")


class PushRequest(Documented):
    repo_id: str = Field(..., description="owner/name on the Hub")
    source_path: str | None = Field(None, description="the artifact's own folder")
    job_id: str | None = Field(None, description="a finished job whose output is pushed (without source_path)")
    private: bool = Field(True, description="the repo is private unless this is false")


class TokenRequest(Documented):
    token: str = Field(..., description="a Hugging Face write token")


class DatasetFolder(Schema):
    path: str = Field(..., min_length=1, description="a folder with train.jsonl (and valid.jsonl)")


class ExportRequest(Schema):
    base_model: str = Field(..., min_length=1)
    adapter_path: str = Field(..., min_length=1, description="a folder with adapters.safetensors")
    method: str | None = Field(None, description="recorded in the manifest")


class PickedFolder(Schema):
    folder_name: str | None = Field(None, description="a folder name from a browser's picker (models--org--name "
                                                      "or a snapshot hash)")
    rel_path: str | None = Field(None, description="a path, absolute or inside the HF cache")


class DatasetRequest(Schema):
    template_id: str = Field(..., description="see GET /api/dataset/templates")
    inputs: dict[str, Any] = Field(default_factory=dict, description="the template's fields")
    model_name: str | None = Field(None, description="the model that writes the rows; default: the served one")
