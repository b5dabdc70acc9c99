"""Which BLAS this process runs on. MLX's Linux CPU wheel links the reference
BLAS; `hearth` preloads Debian's OpenBLAS when it is installed (config/cli.py).

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import os
import sys

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
)


def find_openblas() -> str | None:
    return next((p for p in OPENBLAS_CANDIDATES if os.path.exists(p)), None)


def blas_in_use() -> str:
    """One line for the logs: which BLAS this process runs on."""
    if sys.platform == "darwin":
        return "Accelerate (macOS)"
    preloaded = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p in OPENBLAS_CANDIDATES]
    if preloaded:
        return f"OpenBLAS (preloaded {preloaded[0]})"
    return "reference BLAS (slow: install libopenblas0-pthread, or unset HEARTH_BLAS=reference)"
