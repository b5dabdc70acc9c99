"""Quantize a model with mlx-lm into a repo of its own in the local HF cache
(blobs, snapshot, refs/main), so the library lists it: uniformly to `bits`
by rounding each weight to its nearest level (`method: "rtn"`, mlx-lm's
converter), or mixed precision to a `target_bpw` (see mixed.py), or
calibrated on text the caller names (`calibration_data`) with mlx-lm's own
learned quantizers: GPTQ (`mlx_lm.quant.gptq`, any model) and AWQ
(`mlx_lm.quant.awq`, the model types mlx-lm has a layout for). mlx-lm's
command-line tools fetch their calibration text from the network; the job
gives them the caller's tokens instead, which is why it calls their
functions rather than their scripts. mlx-lm's DWQ (distillation) and
dynamic-quant tools are not offered: they train against the model for
hours on this kind of machine and fetch their data from the Hub."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, cast

from jobs.events import EventLog

BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)
METHODS = ("rtn", "gptq", "awq")  # round to nearest (no data), then the calibrated ones
CALIBRATED = ("gptq", "awq")
GPTQ_BITS = (2, 4, 8)  # the widths mlx-lm's GPTQ packs
N_CALIBRATION = (1, 1024)  # sequences of calibration text
SEQUENCE_LENGTH = (16, 4096)  # tokens in each
MOST_CALIBRATION_TOKENS = 131072  # of them all together
CALIBRATION_BYTES = 64 << 20  # of the calibration file read


def output_repo(model_id: str, path: Path, bits: int, target_bpw: float | None = None, method: str = "rtn") -> str:
    org, _, name = model_id.rpartition("/") if "/" in model_id and not model_id.startswith((".", "/", "~")) \
        else ("local", "", path.name)
    suffix = f"mixed-{target_bpw:g}bpw" if target_bpw is not None else f"{bits}bit"
    return f"{org or 'local'}/{name}-hearth-{suffix}{'' if method == 'rtn' else '-' + method}"


def _count(config: dict, name: str, default: int, bounds: tuple[int, int]) -> int:
    value = config.get(name)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or not bounds[0] <= value <= bounds[1]:
        raise ValueError(f"{name} must be a whole number from {bounds[0]} to {bounds[1]}")
    return value


def check_calibration(config: dict) -> tuple[str, Path | None, int, int]:
    """(method, calibration_data, n_calibration, sequence_length), or ValueError
    naming the field. The data is confined like any path a request names."""
    from core.paths import confine

    method = config.get("method", "rtn")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}")
    n, length = _count(config, "n_calibration", 32, N_CALIBRATION), _count(config, "sequence_length", 512,
                                                                            SEQUENCE_LENGTH)
    data = config.get("calibration_data")
    if method not in CALIBRATED:
        for name in ("calibration_data", "n_calibration", "sequence_length"):
            if config.get(name) is not None:
                raise ValueError(f"{name} is for a calibrated method (method: gptq or awq), not {method}")
        return method, None, n, length
    if not data:
        raise ValueError(f"calibration_data is required with method {method}: a text file, a .jsonl file or a "
                         "dataset folder with train.jsonl")
    if method == "gptq" and config.get("bits", 4) not in GPTQ_BITS:
        raise ValueError(f"bits must be one of {', '.join(map(str, GPTQ_BITS))} with method gptq (the widths "
                         "mlx-lm's GPTQ packs); awq and rtn take 2, 3, 4, 5, 6 or 8")
    if config.get("target_bpw") is not None:
        raise ValueError(f"target_bpw: mixed precision is planned without data; method {method} quantizes "
                         "every layer to bits")
    if n * length > MOST_CALIBRATION_TOKENS:
        raise ValueError(f"n_calibration x sequence_length is {n * length} tokens; at most "
                         f"{MOST_CALIBRATION_TOKENS} (the quantizers hold every layer's inputs for all of them)")
    path = confine(data, "calibration_data")
    if path.is_dir():  # a dataset folder: its train.jsonl, itself confined (a link there may point anywhere)
        path = confine(str(path / "train.jsonl"), "calibration_data")
    if not path.is_file():
        raise ValueError(f"calibration_data: {path} is not a file (or a folder with train.jsonl)")
    return method, path, n, length


def calibration_text(path: Path) -> str:
    """The text of a calibration file: a .jsonl file's rows (Hearth's dataset
    formats: `text`, `prompt` and `completion`, chat `messages`, preference
    `prompt`/`chosen`), one after another; any other file as it is."""
    import json

    from core.paths import read_text

    raw = read_text(path, "calibration_data", limit=CALIBRATION_BYTES)
    if path.suffix != ".jsonl":
        return raw
    parts: list[str] = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ValueError(f"calibration_data: line {number} of {path.name} is not JSON") from None
        if not isinstance(row, dict):
            raise ValueError(f"calibration_data: line {number} of {path.name} is not a JSON object")
        messages = row.get("messages")
        texts = [m.get("content") for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
        texts += [row.get(key) for key in ("text", "prompt", "completion", "chosen")]
        parts.append("\n".join(t for t in texts if isinstance(t, str) and t))
    return "\n\n".join(p for p in parts if p)


def calibration_tokens(tokenizer, path: Path, n: int, length: int, seed: int = 0):
    """At most `n` non-overlapping windows of `length` tokens from the file, as
    mlx-lm's own `quant.utils.load_data` cuts its downloaded text: an
    (windows, length) array; ValueError when the file holds less than one."""
    import mlx.core as mx

    tokens = tokenizer.encode(calibration_text(path))
    windows = len(tokens) // length
    if windows == 0:
        raise ValueError(f"calibration_data: {path.name} holds {len(tokens)} tokens, fewer than one "
                         f"sequence_length ({length})")
    batch = mx.array(tokens[: windows * length]).reshape(windows, length)
    order = mx.random.permutation(windows, key=mx.random.key(seed))[:n]
    return batch[order]


def check(config: dict) -> tuple[int, int, float | None, list[int]]:
    """(bits, group_size, target_bpw, candidate_bits), or ValueError naming the
    field; the calibration fields are `check_calibration`'s."""
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
    if config.get("candidate_bits") is not None and target is None:
        raise ValueError("candidate_bits is for mixed precision: give target_bpw too")
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
    method, data, n_calibration, length = check_calibration(config)
    model_id = config["model_id"]
    stage("resolve", 0.05, f"finding {model_id}")
    _, src = resolve(confine_model_ref(model_id, "model_id"))
    confine_members(src, ["config.json"], "model_id")
    regular_entries(src, "model_id")  # the converter opens every file it knows by name: no FIFO among them
    repo = output_repo(model_id, src, bits, target, method)
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
        if data is not None:
            stage("calibrate", 0.1, f"reading {n_calibration} sequences of {length} tokens from {data.name}")
            stage("quantize", 0.2, f"{method}: {bits} bits, group size {group}, fitted to the calibration text")
            summary = calibrated(method, src, out, data, n_calibration, length, bits, group, log)
        else:
            what = f"a mix of {bits} and {plan.high} bits" if target is not None and plan.high else f"{bits} bits"
            stage("quantize", 0.2, f"quantizing to {what}, group size {group}")
            convert(str(src), mlx_path=str(out), quantize=True, q_bits=bits, q_group_size=group, **extra)
            log.emit("log", line=f"converted {src} -> {out}")
        stage("publish", 0.9, f"publishing {repo} into the local cache")
        snapshot = publish_to_cache(out, repo, Path(constants.HF_HUB_CACHE))
    size = sum(p.stat().st_size for p in snapshot.iterdir())
    return str(snapshot), {"repo_id": repo, "bits": bits, "group_size": group, "size_bytes": size,
                           "source": str(src), "method": method, **summary}


def calibrated(method: str, src: Path, out: Path, data: Path, n: int, length: int, bits: int, group: int,
               log: EventLog) -> dict:
    """Quantize `src` into `out` with mlx-lm's GPTQ or AWQ on the caller's
    calibration text; the summary's calibration figures."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.utils import save

    model, tokenizer, model_config = cast("tuple[Any, Any, dict]", load(str(src), lazy=True, return_config=True))
    inputs = calibration_tokens(tokenizer, data, n, length)
    log.emit("log", line=f"calibrating on {inputs.shape[0]} sequences of {length} tokens from {data}")
    if method == "gptq":
        from mlx_lm.quant.gptq import gptq_quantize

        # Layers GPTQ does not reach (embeddings, norms' neighbours) at mlx-lm's fallback width, never narrower.
        fallback = max(bits, 6)
        model, model_config["quantization"] = gptq_quantize(model, inputs, bits, group, fallback, group)
    else:
        from mlx_lm.quant.awq import AWQ_MODEL_CONFIGS, awq_quantize, update_config

        layout = AWQ_MODEL_CONFIGS.get(str(model_config.get("model_type")))
        if layout is None:
            raise ValueError(f"method awq: mlx-lm has no AWQ layout for {model_config.get('model_type')!r} models "
                             f"(it has {', '.join(sorted(AWQ_MODEL_CONFIGS))}); gptq works for any")
        awq_quantize(model, inputs, layout, group_size=group, bits=bits, embed_bits=max(bits, 4),
                     embed_group_size=32)
        model_config = update_config(model, model_config)
    mx.eval(model.parameters())
    save(str(out), str(src), model, tokenizer, model_config)
    log.emit("log", line=f"{method}: quantized {src} -> {out}")
    return {"calibration": {"data": str(data), "sequences": int(inputs.shape[0]), "sequence_length": length}}
