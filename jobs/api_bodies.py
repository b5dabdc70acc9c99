"""The request bodies of the job routes on `/api` as django-ninja Schemas:
ninja validates each before its route runs, and a refusal reads
`{"ok": false, "error": "<field>: <reason>"}`.

The submit and push bodies (`Body`) are strict: a field of the wrong JSON
type is refused rather than converted, and a field they do not list is
refused by its name, so no option is taken and then ignored. What a field's
value must be beyond its type (a bit width, a path inside the allowed
roots) the route or the job checks, with its own message."""
from __future__ import annotations

from dataclasses import fields
from typing import Any, get_type_hints

from ninja import Schema
from pydantic import ConfigDict, Field, create_model

from core.paths import REPO_ID
from jobs.kinds import finetune


class Body(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)


class ModelRef(Body):
    model_id: str = Field(..., min_length=1, description="a repo id in the HF cache, or a model folder")


class QuantizeRequest(ModelRef):
    bits: int = Field(4, description="2, 3, 4, 5, 6 or 8")
    group_size: int = Field(64, description="32, 64 or 128")
    target_bpw: float | None = Field(None, description="mixed precision: bits per weight, 1.5 to 16")
    candidate_bits: list[int] | None = Field(None, description="widths the mixed mode may pick from")
    rotate_weights: bool = Field(False, description="not offered by this quantizer: true is refused")
    method: str = Field("rtn", description="rtn (round to nearest, no data), gptq or awq (mlx-lm's calibrated "
                                           "quantizers, with calibration_data)")
    calibration_data: str | None = Field(None, description="gptq/awq: a text file, a .jsonl file or a dataset "
                                                           "folder with train.jsonl")
    n_calibration: int | None = Field(None, description="gptq/awq: sequences of calibration text (1 to 1024, "
                                                        "default 32)")
    sequence_length: int | None = Field(None, description="gptq/awq: tokens per sequence (16 to 4096, "
                                                          "default 512)")


class FinetunePaths(Body):
    model_dir: str = Field(..., min_length=1, description="a repo id in the HF cache, or a model folder")
    data_dir: str = Field(..., min_length=1, description="a folder with train.jsonl and optionally valid.jsonl")
    adapter_path: str | None = Field(None, description="where the adapter is written; default under "
                                                       "HEARTH_HOME/adapters")


def _fields(options: type) -> dict[str, Any]:
    """Pydantic field definitions of a dataclass's fields: type, default and its `doc`."""
    hints = get_type_hints(options)
    return {f.name: (hints[f.name], Field(f.default, description=f.metadata.get("doc"))) for f in fields(options)}


# The fine-tune's settings are the trainer's own (`finetune.Options`): one
# list of names, types and defaults for the body and for the job.
FinetuneRequest = create_model("FinetuneRequest", __base__=FinetunePaths, __module__=__name__,
                               __doc__="A LoRA fine-tune; the numbers are checked when the job starts (a bad one "
                                       "fails the job).", **_fields(finetune.Options))


class MergeRequest(Body):
    adapter_a: str = Field(..., min_length=1, description="an adapter folder")
    adapter_b: str = Field(..., min_length=1, description="an adapter folder")
    scales: list[float] | None = Field(None, min_length=2, max_length=2,
                                       description="two numbers; default: each adapter's own scale")


class PushRequest(Body):
    repo_id: str = Field(..., pattern=REPO_ID.pattern, description="owner/name on the Hub")
    source_path: str | None = Field(None, description="the artifact's own folder")
    job_id: str | None = Field(None, description="a finished job whose output is pushed (without source_path)")
    private: bool = Field(True, description="the repo is private unless this is false")


class TokenRequest(Body):
    token: str = Field(..., min_length=1, description="a Hugging Face write token")


class DatasetFolder(Schema):
    path: str = Field(..., min_length=1, description="a folder with train.jsonl (and valid.jsonl)")


class ExportRequest(Schema):
    base_model: str = Field(..., min_length=1)
    adapter_path: str = Field(..., min_length=1, description="a folder with adapters.safetensors")
    method: str | None = Field(None, description="recorded in the manifest")


class PickedFolder(Schema):
    folder_name: str | None = Field(default=None, description="a folder name from a browser's picker "
                                                              "(models--org--name or a snapshot hash)")
    rel_path: str | None = Field(default=None, description="a path, absolute or inside the HF cache")


class DatasetRequest(Schema):
    template_id: str = Field(..., description="see GET /api/dataset/templates")
    inputs: dict[str, Any] = Field(default_factory=dict, description="the template's fields")
    model_name: str | None = Field(None, description="the model that writes the rows; default: the served one")
