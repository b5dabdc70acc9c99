"""A faster SwiGLU for decoding on a CPU whose `exp` is slow.

MLX's CPU backend evaluates `exp` (and so `sigmoid`, `silu`) one element at
a time through the C library where it has no vector code for the
processor: on the 2-core x86 machine Hearth is built on, `mx.exp` over a
(32, 2816) float32 array takes ~2.4 ms while an add takes 0.05 ms, and
mlx-lm's compiled `swiglu` took 3.6 of the 13.4 ms of one llama MLP at 32
rows. So here `exp` is computed from operations that are fast there: a
Cody-Waite reduction to 2^k * e^r, e^r by a degree-6 polynomial (the
Cephes `expf` coefficients, about 1 ulp), and 2^k built from its exponent
bits. Two compiled pieces run it, because a bit-cast cannot be compiled
shapeless (MLX cannot infer a view's shape).

mlx-lm has no switch for this, so `install` rebinds the `swiglu` name in
the model's own mlx-lm modules (every architecture whose MLP calls
`activations.swiglu`), and only after measuring, on this machine, that the
replacement is faster than MLX's own (`exp` is vectorised on Apple silicon,
where nothing changes). Float32 only, and only from FAST_FROM activations a
call (below that, one or two rows of a small model's MLP, mlx-lm's own is
faster); other inputs take mlx-lm's path.
`HEARTH_FAST_SWIGLU=0` turns it off; `=1` forces it on.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

log = logging.getLogger("hearth.engine")

LOG2E = 1.4426950408889634
LN2_HI, LN2_LO = 0.693145751953125, 1.428606765330187045e-06  # ln 2 split so k * LN2_HI is exact
# e^r - 1 - r = r^2 * P(r) on |r| <= ln2 / 2 (Cephes expf).
COEFFS = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# Below this many elements (a decode step of one or two rows) the two compiled pieces cost more to run
# than MLX's own exp saves: measured per call on the 2-core Xeon, 1 x 704 took 97 us against mlx-lm's 78,
# 1 x 2816 took 105 against 112, and 8 x 704 took 111 against 156.
FAST_FROM = 2048
MIN_GAIN = 1.3  # the replacement must be this much faster than MLX's own to be used

_state: dict[str, Any] = {}
_lock = threading.Lock()  # makes the compiled pieces and the timing once, whichever thread asks first


def _pieces():
    """The two compiled halves, made once per process."""
    with _lock:
        if "pieces" not in _state:
            _state["pieces"] = _compile_pieces()
        return _state["pieces"]


def _compile_pieces():
    import mlx.core as mx

    def reduce_and_poly(x):  # e^x = p * 2^k; returns p and the float32 bits of 2^k
        x = mx.clip(x, -87.0, 89.0)  # 2^k is +inf from x = 88.4: silu(g) is then -0, as it should be
        k = mx.floor(x * LOG2E + 0.5)
        r = (x - k * LN2_HI) - k * LN2_LO
        p = COEFFS[0]
        for c in COEFFS[1:]:
            p = p * r + c
        return p * r * r + r + 1.0, mx.left_shift(k.astype(mx.int32) + 127, 23)

    def finish(g, u, p, two_k):  # silu(g) * u = g / (1 + e^-g) * u, divided first so it cannot overflow
        return g / (1.0 + p * two_k) * u

    return mx.compile(reduce_and_poly, shapeless=True), mx.compile(finish, shapeless=True)


def exp(x):
    """e^x for float32 `x` without MLX's `exp`: about 1 ulp on [-87, 88.3];
    +inf from 88.4 (a little early); e^-87 below -87 (SwiGLU needs no less)."""
    import mlx.core as mx

    parts, _ = _pieces()
    p, bits = parts(x)
    return p * mx.stop_gradient(bits).view(mx.float32)


def make_swiglu(original):
    """silu(gate) * x, as mlx-lm's `swiglu`, with the exp above for float32."""
    import mlx.core as mx

    def swiglu(gate, x):
        if gate.dtype != mx.float32 or x.dtype != mx.float32 or gate.size < FAST_FROM:
            return original(gate, x)
        parts, finish = _pieces()
        p, bits = parts(-gate)
        return finish(gate, x, p, mx.stop_gradient(bits).view(mx.float32))  # 2^k is a constant to autodiff

    swiglu.hearth_fast = True  # type: ignore[attr-defined]
    swiglu.hearth_original = original  # type: ignore[attr-defined]
    return swiglu


def restore() -> None:
    """mlx-lm's own SwiGLU back in every module `install` gave this one."""
    with _lock:
        patched, _state["patched"] = _state.get("patched", set()), set()
    for name in patched:
        module = sys.modules.get(name)
        original = getattr(getattr(module, "swiglu", None), "hearth_original", None)
        if original is not None:
            setattr(module, "swiglu", original)  # noqa: B010 (a module's global, not a declared attribute)


def faster_here() -> float:
    """How many times faster the replacement's exp is than MLX's on this
    machine's default device (one ~0.1 s measurement, then remembered)."""
    with _lock:
        gain = _state.get("gain")
    if gain is not None:
        return gain
    import mlx.core as mx

    x = mx.random.normal((64, 4096), key=mx.random.key(0)) * 4
    mx.eval(x)

    def best(fn) -> float:
        mx.eval(fn(x))  # compiles
        times = []
        for _ in range(5):
            started = time.perf_counter()
            mx.eval(fn(x))
            times.append(time.perf_counter() - started)
        return min(times)

    gain = best(mx.exp) / max(best(exp), 1e-9)
    with _lock:
        return _state.setdefault("gain", gain)


def install(model) -> bool:
    """Use the faster SwiGLU in `model`'s mlx-lm modules where it is faster
    here (or as HEARTH_FAST_SWIGLU says). Answers whether it is in use."""
    import mlx.core as mx
    from mlx_lm.models import activations

    setting = os.environ.get("HEARTH_FAST_SWIGLU", "auto").strip().lower()
    if setting in ("0", "off", "false", "no"):
        restore()  # an earlier model in this process may have put it in
        return False
    modules = {sys.modules.get(type(m).__module__) for _, m in model.named_modules()}
    targets = [m for m in modules if m is not None and getattr(m, "swiglu", None) is activations.swiglu]
    if not targets:
        return any(getattr(getattr(m, "swiglu", None), "hearth_fast", False) for m in modules if m is not None)
    if setting not in ("1", "on", "true", "yes"):
        if mx.default_device() != mx.cpu:
            return False
        gain = faster_here()
        if gain < MIN_GAIN:
            log.info("MLX's own exp is fast here (the replacement is %.1fx): SwiGLU left as mlx-lm has it", gain)
            return False
        log.info("SwiGLU with a polynomial exp: %.1fx MLX's exp on this CPU", gain)
    fast = make_swiglu(activations.swiglu)
    for module in targets:
        setattr(module, "swiglu", fast)  # noqa: B010 (a module's global, not a declared attribute)
    with _lock:
        _state.setdefault("patched", set()).update(m.__name__ for m in targets)
    return True
