"""Will a model fit this machine, and how fast should it decode?

Decoding one token reads every weight once (and the KV cache so far), so
its speed is bounded by how fast weights stream through matrix-vector
products: predicted tokens/s = decode bandwidth / (resident weight bytes +
KV bytes at the context). Two rates are measured once per machine and BLAS
and cached in HEARTH_HOME/machine.json: the memory bandwidth of a large
copy, and the *decode bandwidth*: MLX running a chain of float32
matrix-vector products over ~280 MB of weights (in a child process, with
the same BLAS the server runs), which is what decoding does. On a 2-core
x86 machine the second is well under the first (OpenBLAS GEMV through MLX
reaches ~7 GB/s where a copy reaches ~18), and it is the one that predicts
decode speed. On a Linux CPU the loader dequantizes and upcasts to float32
when that fits, so the resident size here is what it will really be.

Other work on the machine during the probe (a build, a training job, the
rest of the server's start-up) lowers what it measures, so the probe also
counts the CPU the rest of the machine used while it timed. A reading
taken while busy is kept but marked, and measured again at the next server
start; as load only lowers a bandwidth, the higher of the two is kept.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

from core import device, procs
from core.blas import cpu_model
from core.fs import write_atomically

TRANSIENT_RESERVE = 256 << 20  # activations and scratch beside weights and KV (as the engine keeps)
TYPICAL_CONTEXT = 8192
SKU_CONTEXT = 32768
# (name, RAM GB, memory bandwidth GB/s): common Apple machines, for the capability matrix.
SKUS = [("M1 8 GB", 8, 68), ("M2 16 GB", 16, 100), ("M3 Pro 18 GB", 18, 150), ("M4 Pro 24 GB", 24, 273),
        ("M2 Max 32 GB", 32, 400), ("M3 Max 64 GB", 64, 400), ("M2 Ultra 128 GB", 128, 800),
        ("M3 Ultra 192 GB", 192, 819)]


@dataclass(frozen=True)
class Machine:
    chip: str
    ram_bytes: int
    usable_bytes: int
    cores: int
    bandwidth_gbs: float  # a large memory copy
    decode_bandwidth_gbs: float  # weights streamed through MLX matrix-vector products
    measured_while_busy: bool = False  # other work took CPU during the decode probe

    def row(self) -> dict:
        return {"chip": self.chip, "ram_bytes": self.ram_bytes, "usable_bytes": self.usable_bytes,
                "cores": self.cores, "bandwidth_gbs": round(self.bandwidth_gbs, 2),
                "decode_bandwidth_gbs": round(self.decode_bandwidth_gbs, 2),
                "measured_while_busy": self.measured_while_busy}


_PROBE = """
import resource, time, mlx.core as mx, psutil
ws = [mx.random.normal((2816, 1024)) for _ in range(24)]
mx.eval(ws)
x = mx.random.normal((1, 1024))
def run():
    y = x
    for w in ws:
        y = (y @ w.T)[:, :1024]
    mx.eval(y)
def busy():  # the machine's busy CPU seconds (guest time is already in user and nice on Linux)
    t = psutil.cpu_times()
    return sum(t) - t.idle - sum(getattr(t, f, 0.0) for f in ("iowait", "guest", "guest_nice"))
def mine():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
run()
best = float("inf")
started, busy0, mine0 = time.perf_counter(), busy(), mine()
for _ in range(5):
    t = time.perf_counter(); run(); best = min(best, time.perf_counter() - t)
others = max(0.0, (busy() - busy0) - (mine() - mine0)) / max(time.perf_counter() - started, 1e-3)
print(sum(w.nbytes for w in ws) / best / 1e9, others)
"""


def busy_cores() -> float:
    """CPU the rest of the machine may use during the probe before the
    reading counts as taken while busy: half a core, or a quarter of them."""
    return max(0.5, 0.25 * (os.cpu_count() or 1))


def measure_decode_bandwidth() -> tuple[float | None, float]:
    """GB/s of weights through MLX matrix-vector products, in a child
    process; and how many cores' worth of CPU everything else on the
    machine used while it timed them (the machine's busy time less its own)."""
    import subprocess

    try:
        done = procs.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=180)
        gbs, others = (float(v) for v in done.stdout.strip().splitlines()[-1].split())
        return (gbs, others) if done.returncode == 0 else (None, 0.0)
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None, 0.0


def usable_bytes() -> int:
    """The memory a model may take on this machine: three quarters of the
    memory it lives in (RAM, or an NVIDIA card's own memory)."""
    return int(_ram_bytes() * 0.75)


def _on_card() -> bool:
    """Models live in an NVIDIA card's memory here (MLX's CUDA build). Asked without loading MLX here (the
    router reads this too)."""
    return sys.platform == "linux" and device.card()["backend"] == "cuda"


def _ram_bytes() -> int:
    return device.card()["memory_bytes"] if _on_card() else device.ram_bytes()


def _chip() -> str:
    return device.card()["name"] if _on_card() else cpu_model()


def measure_bandwidth(megabytes: int = 256, rounds: int = 5) -> float:
    """GB/s of a large copy (read + write), best of `rounds`."""
    import numpy as np

    src = np.ones(megabytes << 17, dtype=np.float64)  # megabytes MiB
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - started)
    return 2 * src.nbytes / best / 1e9


def _key() -> dict:
    return {"ram_bytes": _ram_bytes(), "cores": os.cpu_count() or 1, "chip": _chip(),
            "blas": os.environ.get("LD_PRELOAD", "")}


def _read(cache_path, key: dict) -> dict:
    try:
        read = json.loads(cache_path.read_text())
        if all(read.get(k) == v for k, v in key.items()) and read.get("decode_bandwidth_gbs", 0) > 0:
            return read
    except (OSError, ValueError):
        pass
    return {}


def _machine(key: dict, reading: dict) -> Machine:
    return Machine(key["chip"], key["ram_bytes"], usable_bytes(), key["cores"], reading["bandwidth_gbs"],
                   reading["decode_bandwidth_gbs"], bool(reading.get("measured_while_busy")))


def cached(cache_path) -> Machine | None:
    """This machine as last measured here, or None when it never was (or
    the machine or its BLAS changed since)."""
    key = _key()
    reading = _read(cache_path, key)
    return _machine(key, reading) if reading else None


def machine(cache_path, remeasure_busy: bool = False) -> Machine:
    """This machine, with its bandwidths measured once and then read back.
    With `remeasure_busy` (a server start), a reading taken while the
    machine was busy is measured again, keeping the higher of the two."""
    key = _key()
    old = _read(cache_path, key)
    if old and not (remeasure_busy and old.get("measured_while_busy")):
        return _machine(key, old)
    bandwidth = measure_bandwidth()
    probed, others = measure_decode_bandwidth()
    reading = {"bandwidth_gbs": bandwidth, "decode_bandwidth_gbs": probed or bandwidth / 2,
               "measured_while_busy": others >= busy_cores(), "others_cores": round(others, 2)}
    if old:  # a busy reading measured again. Load only lowers a bandwidth: keep the higher of
        # each. Still busy only if this reading was busy too: a quiet one is a floor the kept value meets.
        reading["bandwidth_gbs"] = max(bandwidth, old["bandwidth_gbs"])
        reading["decode_bandwidth_gbs"] = max(reading["decode_bandwidth_gbs"], old["decode_bandwidth_gbs"])
    try:
        write_atomically(cache_path, json.dumps({**key, **reading, "measured_at": time.time()}),
                         durable=False)  # measured again if lost
    except OSError:
        pass
    return _machine(key, reading)


def kv_bytes_per_token(config: dict, itemsize: int) -> int:
    cfg = {**(config.get("text_config") or {}), **config}
    layers = cfg.get("num_hidden_layers") or cfg.get("n_layer") or cfg.get("num_layers")
    heads = cfg.get("num_attention_heads") or cfg.get("n_head")
    kv_heads = cfg.get("num_key_value_heads") or heads
    hidden = cfg.get("hidden_size") or cfg.get("n_embd")
    head_dim = cfg.get("head_dim") or (hidden // heads if hidden and heads else None)
    if not (layers and kv_heads and head_dim):
        return 0
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * itemsize


def resident_bytes(weights_bytes: int, params: int, usable: int, this_machine: bool = True) -> tuple[int, int]:
    """(weight bytes once loaded, KV item size) on this machine or an Apple one."""
    if this_machine and sys.platform.startswith("linux") and params and params * 4 <= usable:
        return params * 4, 4  # the CPU loader upcasts to float32
    return weights_bytes, 2


def assess(weights: int, kv_per_token: int, usable: int, bandwidth_gbs: float, context_window: int | None,
           context: int = TYPICAL_CONTEXT) -> dict:
    """fits, max_safe_context and the predicted decode rate at `context`."""
    room = usable - weights - TRANSIENT_RESERVE
    max_context = room // kv_per_token if kv_per_token and room > 0 else (0 if room <= 0 else context)
    if context_window:
        max_context = min(max_context, context_window)
    used = min(context, max_context) if max_context else 0
    kv = used * kv_per_token
    tps = bandwidth_gbs * 1e9 / (weights + kv) if weights and room > 0 else 0.0
    return {"fits": room > 0 and max_context > 0, "weights_bytes": weights, "kv_bytes_per_token": kv_per_token,
            "kv_bytes": kv,
            "transient_bytes": TRANSIENT_RESERVE, "total_bytes": weights + kv + TRANSIENT_RESERVE,
            "usable_bytes": usable, "max_safe_context": int(max_context), "predicted_decode_tps": round(tps, 2)}


def sku_matrix(weights_bytes: int, config: dict, context_window: int | None) -> list[dict]:
    rows = []
    kv = kv_bytes_per_token(config, 2)
    for name, ram_gb, bandwidth in SKUS:
        usable = int(ram_gb * 1e9 * 0.75)
        report = assess(weights_bytes, kv, usable, bandwidth, context_window, SKU_CONTEXT)
        rows.append({"sku": name, "ram_gb": ram_gb, "fits": report["fits"], "max_context": report["max_safe_context"],
                     "decode_tps": report["predicted_decode_tps"]})
    return rows
