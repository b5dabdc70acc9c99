"""Quantize a model with mlx-lm's converter into a repo of its own in the
local HF cache (blobs, snapshot, refs/main), so the library lists it:
uniformly to `bits`, or mixed precision to a `target_bpw` (see mixed.py)."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, cast

from jobs.events import EventLog

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)


IGNORED = ("reference", "calibration_mix", "n_calibration")  # calibration needs data we never download


def output_repo(model_id: str, path: Path, bits: int, target_bpw: float | None = None) -> str:
    org, _, name = model_id.rpartition("/") if "/" in model_id and not model_id.startswith((".", "/", "~")) \
        else ("local", "", path.name)
    suffix = f"mixed-{target_bpw:g}bpw" if target_bpw is not None else f"{bits}bit"
    return f"{org or 'local'}/{name}-hearth-{suffix}"


def check(config: dict) -> tuple[int, int, float | None, list[int]]:
    """(bits, group_size, target_bpw, candidate_bits), or ValueError naming the field."""
    bits, group = config.get("bits", 4), config.get("group_size", 64)
    target, candidates = config.get("target_bpw"), config.get("candidate_bits", list(BITS))
    if bits not in BITS:
        raise ValueError(f"bits must be one of {', '.join(map(str, BITS))}")
    if group not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {', '.join(map(str, GROUP_SIZES))}")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))
                               or not 1.5 <= target <= 16):
        raise ValueError("target_bpw must be a number of bits per weight between 1.5 and 16")
    if not isinstance(candidates, list) or not candidates or any(b not in BITS for b in candidates):
        raise ValueError(f"candidate_bits must be a list drawn from {', '.join(map(str, BITS))}")
    if config.get("rotate_weights"):
        raise ValueError("rotate_weights: weight rotation is not offered by this quantizer")
    return bits, group, (float(target) if target is not None else None), sorted(set(candidates))


def run(config: dict, log: EventLog, stage_delay: float = 0.0) -> tuple[str, dict]:
    import time

    from huggingface_hub import constants
    from mlx_lm import convert

    from core.paths import confine_members, confine_model_ref, read_json, regular_entries
    from hub.publish import publish_to_cache
    from inference.engine.loader import resolve

    def stage(name: str, progress: float, message: str) -> None:
        log.emit("stage", stage=name, progress=progress, message=message)
        if stage_delay:
            time.sleep(stage_delay)

    bits, group, target, candidates = check(config)
    for name in IGNORED:
        if config.get(name):
            log.emit("log", line=f"{name} is not used: this quantizer needs no calibration data")
    model_id = config["model_id"]
    stage("resolve", 0.05, f"finding {model_id}")
    _, src = resolve(confine_model_ref(model_id, "model_id"))
    confine_members(src, ["config.json"], "model_id")
    regular_entries(src, "model_id")  # the converter opens every file it knows by name: no FIFO among them
    repo = output_repo(model_id, src, bits, target)
    config_in = read_json(src / "config.json", "model_id")
    if not isinstance(config_in, dict):
        raise ValueError(f"{src / 'config.json'} is not a JSON object")
    if config_in.get("quantization"):
        raise ValueError(f"{model_id} is already quantized ({config_in['quantization']})")
    extra, summary = {}, {}
    if target is not None:
        from mlx_lm import load

        from jobs.kinds.mixed import plan as mixed_plan

        stage("plan", 0.1, f"planning a mix of {candidates} bits for {target:g} bits per weight")
        # Typed as a union of the 2- and 3-tuple; without return_config it answers the 2-tuple.
        model, _ = cast("tuple[Any, Any]", load(str(src), lazy=True))
        plan = mixed_plan(model, target, candidates, group, str(config_in.get("torch_dtype") or "float16"))
        del model
        bits = plan.low
        extra["quant_predicate"] = plan.predicate(group)
        summary = {"target_bpw": target, "planned_bpw": plan.bpw,
                   "layers_by_bits": {str(k): v for k, v in sorted(plan.histogram.items())}}
        log.emit("log", line=f"plan: {plan.histogram} layers by bits, {plan.bpw} bits per weight")
    with tempfile.TemporaryDirectory(prefix="hearth-quantize-") as work:
        out = Path(work) / "model"
        what = f"a mix of {bits} and {plan.high} bits" if target is not None and plan.high else f"{bits} bits"
        stage("quantize", 0.2, f"quantizing to {what}, group size {group}")
        convert(str(src), mlx_path=str(out), quantize=True, q_bits=bits, q_group_size=group, **extra)
        log.emit("log", line=f"converted {src} -> {out}")
        stage("publish", 0.9, f"publishing {repo} into the local cache")
        snapshot = publish_to_cache(out, repo, Path(constants.HF_HUB_CACHE))
    size = sum(p.stat().st_size for p in snapshot.iterdir())
    return str(snapshot), {"repo_id": repo, "bits": bits, "group_size": group, "size_bytes": size,
                           "source": str(src), **summary}
