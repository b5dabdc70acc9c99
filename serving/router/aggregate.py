"""`/stats` and `/metrics` of a router: its own, with every loaded model's
beside it. Each child's Prometheus series get a `model` label; series of
one name from several processes are written as one family (a Prometheus
text page may name a family once)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


class _Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return self.families


def merge_metrics(own: bytes, children: dict[str, str]) -> bytes:
    """The router's page `own` and each model's page, labelled `model`."""
    merged: dict[str, Metric] = {}
    pages = [(None, own.decode())] + sorted(children.items())
    for model, text in pages:
        for family in text_string_to_metric_families(text):
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            elif target.type != family.type:
                continue  # the same name meaning two things: keep the first
            for sample in family.samples:
                labels = dict(sample.labels, model=model) if model is not None else sample.labels
                target.samples.append(sample._replace(labels=labels))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(merged.values())))
    return generate_latest(registry)


def merge_stats(own: dict, children: dict[str, dict], router: dict) -> dict:
    """The router's /stats with `router` (its models' states) and each
    loaded model's own /stats under `models`."""
    return {**own, "router": router, "models": children}
