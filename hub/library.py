"""The library as the routes show it: registry rows with a fit verdict for
this machine, cached for 30 s. The cache also turns over as soon as a
download or a quantize job finishes, in this process or another."""
from __future__ import annotations

import threading
import time

from core import home
from core.modelconfig import context_window
from hub import fit, registry

CACHE_S = 30.0
_lock = threading.Lock()
_cached: dict = {"at": 0.0, "stamp": None, "models": None}


_probe_lock = threading.Lock()


def this_machine(remeasure_busy: bool = False) -> fit.Machine:
    """Measured once per HEARTH_HOME; `remeasure_busy` (a server start)
    measures again a reading taken while the machine was busy."""
    if not remeasure_busy:  # a reading already there serves at once, even while a start measures again
        found = fit.cached(home.machine())
        if found is not None:
            return found
    with _probe_lock:  # the first call measures; the others wait for it
        return fit.machine(home.machine(), remeasure_busy)


def mark_changed() -> None:
    """Something outside the downloads added models to the cache (a quantize
    job, in the worker's process): every process's listing is stale now."""
    home.library_changed().touch()


def _stamp() -> tuple:
    """Changes whenever something that adds models to the cache finishes."""
    from django.db.models import Max

    from hub.models import Download

    done = Download.objects.filter(state="done").aggregate(m=Max("finished_at"))["m"]
    try:
        quantized = home.library_changed().stat().st_mtime_ns
    except OSError:
        quantized = None
    return done, quantized


def assessment(model: registry.LocalModel, machine: fit.Machine) -> dict | None:
    if not model.config:
        return None
    weights, itemsize = fit.resident_bytes(model.weights_bytes, model.params, machine.usable_bytes)
    window = context_window(model.config)
    report = fit.assess(weights, fit.kv_bytes_per_token(model.config, itemsize), machine.usable_bytes,
                        machine.decode_bandwidth_gbs, window)
    return {k: report[k] for k in ("fits", "max_safe_context", "predicted_decode_tps")}


def models(refresh: bool = False) -> list[tuple[registry.LocalModel, dict | None]]:
    stamp = _stamp()
    with _lock:
        fresh = _cached["models"] is not None and time.monotonic() - _cached["at"] < CACHE_S \
            and _cached["stamp"] == stamp
        if fresh and not refresh:
            return _cached["models"]
    machine = this_machine()
    rows = [(m, assessment(m, machine)) for m in registry.scan()]
    with _lock:
        _cached.update(at=time.monotonic(), stamp=stamp, models=rows)
    return rows


def invalidate() -> None:
    with _lock:
        _cached["models"] = None
