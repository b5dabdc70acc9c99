"""What `/stats` and `/metrics` report: the engine's live state, its prompt
cache and SSD tier, admission limits, HTTP traffic, and the BLAS this
process runs on."""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from core import blas, device, home
from inference.engine import lanes, loader
from inference.engine.admission import MAX_QUEUED, TRANSIENT_RESERVE
from inference.engine.engine import DRAFT_TOKENS, Engine
from inference.engine.metrics import REGISTRY

if TYPE_CHECKING:
    from serving.runtime import Runtime

HTTP_REQUESTS = Counter("hearth_http_requests", "HTTP answers by route, method and status",
                        ["route", "method", "status"], registry=REGISTRY)


def count_request(route: str, method: str, status: int) -> None:
    HTTP_REQUESTS.labels(route or "/", method, str(status)).inc()


# -- /stats --------------------------------------------------------------
def stats_body(runtime: Runtime) -> dict:
    body = _engine_stats(runtime)
    body["access"] = {"api_key_required": bool(runtime.api_keys), "cors_origins": sorted(runtime.cors_origins),
                      "insecure_no_auth": runtime.insecure_no_auth}
    if runtime.warning:
        body["warning"] = runtime.warning
    body["device"] = device.card()  # MLX's own answer where a model is loaded; the router asks a child
    body["blas"] = _blas()
    if runtime.transcriber is not None:
        body["transcription"] = runtime.transcriber.stats()
    if runtime.demo_build is not None:
        body["demo_build"] = runtime.demo_build
    if runtime.speech_build is not None:
        body["speech_build"] = runtime.speech_build
    body["phases"] = runtime.phases.stats()
    return body


@functools.cache
def _blas() -> dict:
    """Read once: the library is fixed at process start, and so is the measurement that chose it.
    On a GPU no CPU BLAS is chosen (`in_use` false)."""
    if device.card()["type"] == "gpu":
        return {"in_use": False, "name": None, "label": "none: MLX computes on the GPU", "library": None,
                "chosen_by": "device", "overridden": False, "measured_at": None, "shapes": None,
                "others_cpu": None, "candidates": []}
    return {**blas.report(home.blas_cache()), "in_use": True}


def _engine_stats(runtime: Runtime) -> dict:
    engine = runtime.engine
    body: dict = {"server": {"owner": "serve", "model": None, "started_at": runtime.started_at,
                             "draining": runtime.draining}, "response_store": runtime.responses.stats(),
                  "streams": runtime.streams.stats(),
                  # the bounds in force hold before a model is loaded, and in a router, which passes them on
                  "limits": dataclasses.asdict(runtime.options.limits)}
    if engine is None or engine.loaded is None or engine.cache is None:  # not loaded, or still setting up
        return body
    model = engine.loaded
    body["server"]["model"] = model.model_id
    body["prompt_cache"] = engine.cache.stats()
    body["kv_quant"] = _kv_quant(engine, model)
    if engine.ssd is not None:
        body["ssd_cache"] = engine.ssd.stats()
    body["admission"] = _admission(engine, model)
    body["batch"] = _batch(engine)
    body["speculation"] = _speculation(engine)
    body["jump_forward"] = _jump_forward(engine)
    adapters = model.adapters
    body["adapters"] = {"mounted": sorted(adapters.ids()), "default": "+".join(adapters.default) or None,
                        "running": "+".join(a.id for a in adapters.active) if engine.active_rows else None,
                        "ram_bytes": sum(a["ram_bytes"] for a in adapters.describe())}
    s = engine.stats
    body["grammar"] = model.grammar_compiler.stats()
    options = runtime.options
    body["templates"] = options.templates.stats() if options.templates is not None else {"allowed": False}
    body["engine"] = {
        "active": engine.active_rows, "queued": engine.queued, "requests_total": s.requests_total,
        "failed_rows": s.failed_rows, "failed_steps": s.failed_steps, "peak_rows": s.peak_rows,
        "prompt_tokens_total": s.prompt_tokens_total, "cached_tokens_total": s.cached_tokens_total,
        "generated_tokens_total": s.generated_tokens_total,
        "last_decode_tokens_per_s": round(s.last_decode_tps, 2), "dtype": model.dtype,
        "mlx_memory": _mlx_memory(),
    }
    return body


def _mlx_memory() -> dict:
    """MLX's allocator: what live arrays hold, what it keeps for reuse, its peak."""
    import mlx.core as mx

    return {"active_bytes": mx.get_active_memory(), "cache_bytes": mx.get_cache_memory(),
            "peak_bytes": mx.get_peak_memory()}


def _kv_quant(engine: Engine, model: loader.LoadedModel) -> dict:
    bits = engine.config.kv_quant
    layers = int(model.config.get("num_hidden_layers") or model.config.get("text_config", {})
                 .get("num_hidden_layers") or 0)
    if bits:
        name = f"kv{bits}"
        mode = f"uniform-kv{bits}"
    else:
        name = mode = "bf16" if "bfloat16" in model.dtype else model.dtype
    return {"mode": mode, "layers": {name: layers}, "attention": {"global": layers, "sliding_window": 0},
            "recurrent_layers": 0,
            # a quantized KV cache runs on the serial lane
            "group_size": engine.lane.kv_group if bits and isinstance(engine.lane, lanes.SerialLane) else None}


def _admission(engine: Engine, model: loader.LoadedModel) -> dict:
    usable = loader.memory_budget()
    per_token = model.kv_bytes_per_token
    safe = max((usable - model.weights_bytes - TRANSIENT_RESERVE) // per_token, 0) if per_token and usable else 0
    if model.context_window:
        safe = min(safe, model.context_window)
    return {"max_safe_context": safe, "enforced_context_tokens": engine.enforced_context,
            "memory_budget_bytes": engine.config.memory_budget, "kv_budget_bytes": engine.config.kv_budget,
            "usable_bytes": usable,
            "weights_bytes": model.weights_bytes, "kv_bytes_per_token": per_token,
            "max_queued": MAX_QUEUED, "queued": engine.queued}


def _speculation(engine: Engine) -> dict | None:
    kind = engine.speculation
    if kind is None:
        return {"off": engine.spec_off} if engine.spec_off else None
    t = engine.spec_totals
    return {"kind": kind, "draft_model": engine.config.draft_model if kind == "model" else None,
            "draft_tokens": engine.config.draft_tokens or DRAFT_TOKENS[kind], "rows": t.rows,
            "drafted": t.drafted, "accepted": t.accepted, "target_calls": t.target_calls,
            "acceptance": round(t.accepted / t.drafted, 4) if t.drafted else None}


def _jump_forward(engine: Engine) -> dict:
    t = engine.spec_totals
    return {"enabled": engine.jump_forward, "rows": t.fill_rows, "events": t.fill_events, "injected": t.injected}


def _batch(engine: Engine) -> dict:
    return {
        "configured": engine.config.batch or "auto", "mode": engine.mode, "batched": engine.mode == "batch",
        "serial_reason": engine.serial_reason, "max_rows": engine.capacity, "active_rows": engine.active_rows,
        "pending_rows": engine.pending_rows, "submitted_rows": engine.stats.submitted_rows,
        "kv_bytes": engine.kv_bytes, "kv_budget_bytes": engine.kv_room or None,
        "held_for_memory": engine.held_for_memory, "prefill_chunk": engine.config.prefill_chunk,
    }


# -- /metrics --------------------------------------------------------------
class _EngineCollector:
    """Gauges and counters read from a runtime's engine at scrape time, so
    they agree with /stats."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime

    def collect(self):
        engine = self.runtime.engine
        if engine is None or engine.loaded is None or engine.cache is None:  # not loaded, or still setting up
            return
        yield GaugeMetricFamily("hearth_queue_depth", "Requests waiting for a row", value=engine.queued)
        yield GaugeMetricFamily("hearth_active_rows", "Rows decoding or prefilling", value=engine.active_rows)
        yield GaugeMetricFamily("hearth_batch_capacity", "Rows that may run at once", value=engine.capacity)
        cache = engine.cache.stats()
        for name in ("hits", "misses", "session_hits", "session_misses", "evictions"):
            yield CounterMetricFamily(f"hearth_prompt_cache_{name}", f"Prompt cache {name.replace('_', ' ')}",
                                      value=cache[name])
        yield GaugeMetricFamily("hearth_prompt_cache_bytes", "Bytes held by the RAM prompt cache",
                                value=cache["bytes"])
        yield GaugeMetricFamily("hearth_prompt_cache_entries", "Entries in the RAM prompt cache",
                                value=cache["entries"])
        if engine.ssd is not None:
            ssd = engine.ssd.stats()
            yield GaugeMetricFamily("hearth_ssd_cache_bytes", "Bytes on the SSD tier", value=ssd["bytes"])
            yield GaugeMetricFamily("hearth_ssd_cache_pending_snapshots", "Snapshots waiting to be written",
                                    value=ssd["pending_snapshots"])
            yield CounterMetricFamily("hearth_ssd_cache_restores", "Entries restored from the SSD tier",
                                      value=ssd["restores"])


def render_metrics(runtime: Runtime) -> tuple[bytes, str]:
    """The process's counters and histograms, then `runtime`'s engine gauges."""
    engine = CollectorRegistry(auto_describe=False)
    engine.register(_EngineCollector(runtime))
    return generate_latest(REGISTRY) + generate_latest(engine), CONTENT_TYPE_LATEST
