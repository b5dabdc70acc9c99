"""The `hearth` command: Django's management commands, with an optimized
BLAS preloaded on Linux.

MLX's Linux CPU wheel links the reference BLAS, several times slower than
OpenBLAS for float32 matmuls. The dynamic loader only honours LD_PRELOAD at
process start, so `hearth` re-executes itself once with it set; every child
it spawns (the demo-model training, job runners) inherits it.
"""
from __future__ import annotations

import os
import sys

from core.blas import find_openblas


def _reexec_with_openblas(argv: list[str]) -> None:
    if sys.platform != "linux" or os.environ.get("HEARTH_BLAS", "").lower() == "reference":
        return
    lib = find_openblas()
    current = os.environ.get("LD_PRELOAD", "")
    if lib is None or lib in current.split(":") or os.environ.get("_HEARTH_REEXEC"):
        return
    env = dict(os.environ, LD_PRELOAD=f"{lib}:{current}" if current else lib, _HEARTH_REEXEC="1")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "config.cli", *argv], env)


def main(argv: list[str] | None = None, prog: str = "hearth") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _reexec_with_openblas(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # `hearth make-demo-model` is Django's `make_demo_model`.
    if argv and not argv[0].startswith("-"):
        argv[0] = argv[0].replace("-", "_")
    from django.core.management import execute_from_command_line

    execute_from_command_line([prog, *argv])
    return 0


if __name__ == "__main__":
    sys.exit(main())
