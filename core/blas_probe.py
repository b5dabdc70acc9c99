"""The BLAS probe: run as a script in a child process that has one BLAS
library preloaded (core.blas starts it), it times MLX float32 matmuls and
prints one JSON line.

It first makes sure the preload took: the `cblas_sgemm` that the process
resolves must come from the library asked for (the dynamic loader skips a
missing or broken LD_PRELOAD entry with a warning and carries on with the
wheel's reference BLAS, and a library without the symbol changes nothing).
Then each shape's product is checked against numpy in float64 before it
is timed, so a library that computes wrong answers is refused. The time of
a shape is the fastest of its calls within the budget: the least disturbed
by other processes on a shared machine.

Standard library, numpy and MLX only: this file runs as a script."""
from __future__ import annotations

import ctypes
import json
import os
import sys
import time

TOLERANCE = 1e-4  # largest error relative to the largest entry; float32 at K=2048 is ~1e-6


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _sgemm_owner() -> str | None:
    """The file `cblas_sgemm` resolves to in the global scope, or None."""
    scope = ctypes.CDLL(None)
    try:
        sgemm = scope.cblas_sgemm
    except AttributeError:
        return None
    try:
        dladdr = scope.dladdr
    except AttributeError:  # glibc before 2.34 keeps it in libdl
        dladdr = ctypes.CDLL("libdl.so.2").dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(ctypes.cast(sgemm, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return info.dli_fname.decode()


def _fail(reason: str) -> None:
    print(json.dumps({"ok": False, "error": reason}))
    sys.exit(0)


def main() -> None:
    args = json.loads(sys.argv[1])
    library, budget, shapes = args["library"], float(args["budget_s"]), args["shapes"]
    import mlx.core as mx
    import numpy as np

    if library:
        owner = _sgemm_owner()
        if owner is None or os.path.realpath(owner) != os.path.realpath(library):
            _fail(f"cblas_sgemm comes from {owner or 'no preloaded library'}, not {library}")
    rng = np.random.default_rng(0)
    gflops = {}
    for m, k, n in shapes:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k), dtype=np.float32)  # stored as a Linear layer's weight
        xs, ws = mx.array(x), mx.array(w)
        got = np.array(xs @ ws.T)
        want = x.astype(np.float64) @ w.astype(np.float64).T
        error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        if not error <= TOLERANCE:  # a NaN fails too
            _fail(f"wrong result at M={m}, K={k}, N={n}: relative error {error:.3g}")
        best, calls, started = float("inf"), 0, time.perf_counter()
        while calls < 3 or time.perf_counter() - started < budget:
            t = time.perf_counter()
            mx.eval(xs @ ws.T)
            best = min(best, time.perf_counter() - t)
            calls += 1
        gflops[str(m)] = round(2 * m * k * n / best / 1e9, 2)
    print(json.dumps({"ok": True, "gflops": gflops}))


if __name__ == "__main__":
    main()
