"""The device MLX computes on here: this CPU (Linux's CPU wheel, with the
BLAS core.blas picks), Apple silicon's GPU (Metal, memory shared with the
CPU), or an NVIDIA card (MLX's CUDA build, `pip install -e '.[cuda]'`).

`gpu_expected()` answers without importing MLX, for the command line before
it re-executes itself with a BLAS: on a machine where MLX will run on a GPU,
no CPU BLAS is measured or preloaded. `describe()` asks MLX, in a process
that has it loaded anyway.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import functools
import importlib.metadata
import os
import sys

CUDA_PACKAGES = ("mlx-cuda-13", "mlx-cuda-12", "mlx-cuda")
NVIDIA_DRIVER = "/proc/driver/nvidia/version"


def cuda_build_installed() -> bool:
    for name in CUDA_PACKAGES:
        try:
            importlib.metadata.distribution(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def gpu_expected() -> bool:
    """MLX will compute on a GPU here: macOS (Metal), or Linux with MLX's
    CUDA build installed, an NVIDIA driver loaded and a card not hidden by
    CUDA_VISIBLE_DEVICES. A guess made without MLX: `describe()` is what
    MLX says, and /stats shows that."""
    if sys.platform == "darwin":
        return True
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip() in ("", "-1") and "CUDA_VISIBLE_DEVICES" in os.environ
    return sys.platform == "linux" and not hidden and os.path.exists(NVIDIA_DRIVER) and cuda_build_installed()


def summarize(on_gpu: bool, backend: str, info: dict, ram_bytes: int) -> dict:
    """The `device` object of /stats from what MLX reports: `type` (gpu or
    cpu), `backend` (cuda, metal or cpu), `name`, and `memory_bytes`, the
    memory models live in (the card's own on CUDA; on Metal and on a CPU,
    the machine's RAM)."""
    memory = info.get("total_memory") if on_gpu and backend == "cuda" else None
    return {"type": "gpu" if on_gpu else "cpu", "backend": backend if on_gpu else "cpu",
            "name": str(info.get("device_name") or info.get("architecture") or "unknown"),
            "memory_bytes": int(memory) if memory else ram_bytes}


def ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


@functools.cache
def describe() -> dict:
    """This process's device (MLX's default), read once: it is fixed at start.
    Imports MLX: a process that serves no model (the router) asks `card()`."""
    import mlx.core as mx

    on_gpu = mx.default_device() == mx.gpu
    backend = "cuda" if mx.cuda.is_available() else "metal" if mx.metal.is_available() else "cpu"
    return summarize(on_gpu, backend, dict(mx.device_info()), ram_bytes())


_ASK = ("import json, mlx.core as mx; d = mx.default_device() == mx.gpu; b = 'cuda' if mx.cuda.is_available() "
        "else 'metal' if mx.metal.is_available() else 'cpu'; print(json.dumps([d, b, dict(mx.device_info())]))")


@functools.cache
def card() -> dict:
    """`describe()` for a process that must not load MLX (nor open a CUDA
    context that no budget counts): where a GPU is expected, asked of a child
    process once; elsewhere the CPU, without asking MLX."""
    if "mlx.core" in sys.modules:
        return describe()
    if not gpu_expected():
        from core.blas import cpu_model

        return summarize(False, "cpu", {"device_name": cpu_model()}, ram_bytes())
    import json
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-c", _ASK], capture_output=True, text=True, timeout=120, check=True)
        on_gpu, backend, info = json.loads(done.stdout.strip().splitlines()[-1])
        return summarize(on_gpu, backend, info, ram_bytes())
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return summarize(False, "cpu", {"device_name": "unknown"}, ram_bytes())


def planned_line() -> str:
    """`line()` without importing MLX (a process that serves none: the router)."""
    from core.blas import blas_in_use, cpu_model

    if sys.platform == "darwin":
        return "the GPU (Metal)"
    if gpu_expected():
        return "the GPU (MLX's CUDA build; no CPU BLAS is chosen)"
    return f"CPU ({cpu_model()}), BLAS: {blas_in_use()}"


def line() -> str:
    """One line for the logs: the device, and on a CPU the BLAS it runs on."""
    from core.blas import blas_in_use

    d = describe()
    if d["type"] == "gpu":
        return f"{d['name']} ({'CUDA' if d['backend'] == 'cuda' else 'Metal'}, {d['memory_bytes'] / 2**30:.0f} GiB)"
    return f"CPU ({d['name']}), BLAS: {blas_in_use()}"
