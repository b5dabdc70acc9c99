"""Prometheus instruments the engine updates as it runs.

They live in their own registry (`REGISTRY`), which `/metrics` renders
together with the HTTP counters and a collector reading the engine's live
gauges. prometheus_client is thread-safe, so the engine thread writes them
directly.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

PROMPT_TOKENS = Counter("hearth_prompt_tokens", "Prompt tokens admitted", registry=REGISTRY)
CACHED_TOKENS = Counter("hearth_prompt_cached_tokens", "Prompt tokens served from the prompt cache",
                        registry=REGISTRY)
GENERATED_TOKENS = Counter("hearth_generated_tokens", "Tokens generated", registry=REGISTRY)
GENERATIONS = Counter("hearth_generations", "Finished generations by lane and finish reason",
                      ["lane", "finish_reason"], registry=REGISTRY)
TTFT = Histogram("hearth_time_to_first_token_seconds", "Submit to first generated token",
                 buckets=_LATENCY_BUCKETS, registry=REGISTRY)
ITL = Histogram("hearth_inter_token_latency_seconds", "Time between consecutive tokens of one request",
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5), registry=REGISTRY)
