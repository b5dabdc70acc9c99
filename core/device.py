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
    CUDA build installed and an NVIDIA driver loaded."""
    if sys.platform == "darwin":
        return True
    return sys.platform == "linux" and os.path.exists(NVIDIA_DRIVER) and cuda_build_installed()


def summarize(on_gpu: bool, backend: str, info: dict, ram_bytes: int) -> dict:
    """The `device` object of /stats from what MLX reports: `type` (gpu or
    cpu), `backend` (cuda, metal or cpu), `name`, and `memory_bytes`, the
    memory models live in (the card's own on CUDA; on Metal and on a CPU,
    the machine's RAM), with `free_bytes` where the card says."""
    if on_gpu and backend == "cuda":
        memory, free = info.get("total_memory"), info.get("free_memory")
    else:
        memory, free = ram_bytes, None
    body = {"type": "gpu" if on_gpu else "cpu", "backend": backend if on_gpu else "cpu",
            "name": str(info.get("device_name") or info.get("architecture") or "unknown"),
            "memory_bytes": int(memory) if memory else ram_bytes}
    if free is not None:
        body["free_bytes"] = int(free)
    return body


def ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


@functools.cache
def describe() -> dict:
    """This process's device (MLX's default), read once: it is fixed at start."""
    import mlx.core as mx

    on_gpu = mx.default_device() == mx.gpu
    backend = "cuda" if mx.cuda.is_available() else "metal" if mx.metal.is_available() else "cpu"
    return summarize(on_gpu, backend, dict(mx.device_info()), ram_bytes())


def on_gpu() -> bool:
    return describe()["type"] == "gpu"


def planned_line() -> str:
    """`line()` without importing MLX (a process that serves none: the router)."""
    from core.blas import blas_in_use

    if sys.platform == "darwin":
        return "the GPU (Metal)"
    if gpu_expected():
        return "the GPU (MLX's CUDA build; no CPU BLAS is chosen)"
    return f"CPU, BLAS: {blas_in_use()}"


def line() -> str:
    """One line for the logs: the device, and on a CPU the BLAS it runs on."""
    from core.blas import blas_in_use

    d = describe()
    if d["type"] == "gpu":
        return f"{d['name']} ({'CUDA' if d['backend'] == 'cuda' else 'Metal'}, {d['memory_bytes'] / 2**30:.0f} GiB)"
    return f"CPU ({d['name']}), BLAS: {blas_in_use()}"
