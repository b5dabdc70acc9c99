"""The library's lineage as a graph, read from what Hearth already keeps:
the jobs table (dataset, fine-tune and quantize jobs and what each read
and wrote), the adapters table (fine-tunes, merges and their sources),
the exports' manifests, the models in the HF cache, and the models this
server has loaded. `GET /api/lineage` answers it; the dashboard's Lineage
page (`/dag`) draws it.

A node is `{id, kind, label, href, ...}`, kind one of model, dataset, job,
adapter, export, served; an edge is `{source, target}`. Models are keyed by
`model_key`, so a job that named a model by its repo id and one that named
its snapshot folder meet at one node.
"""
from __future__ import annotations

import json
from pathlib import Path

from core import home
from core.paths import read_json
from jobs.adapters import adapter_config, model_name
from jobs.models import Adapter, Job

KINDS = ("dataset", "finetune", "quantize")  # the jobs that make something the library holds
MOST_JOBS = 200  # the newest ones; older jobs drop out of the picture, not out of the table
MOST_EXPORTS = 200


class Graph:
    def __init__(self):
        self.nodes: dict[str, dict] = {}
        self.edges: dict[tuple[str, str], dict] = {}

    def node(self, key: str, kind: str, label: str, href: str, **extra) -> str:
        found = self.nodes.get(key)
        if found is None:
            self.nodes[key] = {"id": key, "kind": kind, "label": label, "href": href, **extra}
        else:
            found.update({k: v for k, v in extra.items() if v is not None})
        return key

    def edge(self, source: str | None, target: str | None) -> None:
        if source and target and source != target:
            self.edges.setdefault((source, target), {"source": source, "target": target})

    def model(self, ref, **extra) -> str | None:
        name = model_key(ref)
        if name is None:
            return None
        return self.node(f"model:{name}", "model", str(ref), "#/models", **extra)

    def folder(self, kind: str, path, href: str) -> str | None:
        if not path:
            return None
        resolved = str(Path(str(path)).expanduser().resolve())
        return self.node(f"{kind}:{resolved}", kind, Path(resolved).name, href, path=resolved)

    def answer(self) -> dict:
        return {"nodes": list(self.nodes.values()), "edges": list(self.edges.values())}


def model_key(ref) -> str | None:
    """One key for a model however it is named: `model_name`'s, lower-cased."""
    name = model_name(ref)
    return name.lower() if name else None


def _config(job: Job) -> dict:
    try:
        config = json.loads(job.config_text() or "{}")
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _summary(job: Job) -> dict:
    """A finished job's summary (its `message`), or {}."""
    if job.status != "done" or not job.message:
        return {}
    try:
        summary = json.loads(job.message)
    except ValueError:
        return {}
    return summary if isinstance(summary, dict) else {}


def build(library: list[str], served: list[str]) -> dict:
    """The lineage graph: `library` the repo ids in the HF cache, `served` the
    models this server has loaded (or is loading)."""
    graph = Graph()
    for repo in library:
        graph.model(repo, in_library=True)
    # Brief: a job whose settings are larger than a path's worth (a dataset's pasted rows) names nothing here.
    jobs = Job.objects.brief().filter(kind__in=KINDS).order_by("-created_at")[:MOST_JOBS]
    for job in reversed(list(jobs)):
        config, summary = _config(job), _summary(job)
        key = graph.node(f"job:{job.id}", "job", f"{job.kind} {job.id[:8]}", f"#/jobs/{job.id}",
                         job_kind=job.kind, status=job.status)
        if job.kind == "dataset":
            made = job.output_path if job.status == "done" else None
            graph.edge(key, graph.folder("dataset", made, f"#/jobs/{job.id}"))
        elif job.kind == "finetune":
            graph.edge(graph.model(config.get("model_dir")), key)
            graph.edge(graph.folder("dataset", config.get("data_dir"), f"#/jobs/{job.id}"), key)
            graph.edge(key, graph.folder("adapter", config.get("adapter_path"), "#/adapters"))
        elif job.kind == "quantize":
            graph.edge(graph.model(config.get("model_id")), key)
            graph.edge(key, graph.model(summary.get("repo_id"), derived=True))
    for adapter in Adapter.objects.all():
        made = graph.folder("adapter", adapter.path, "#/adapters")
        if made is None:
            continue
        graph.nodes[made].update(label=adapter.name, method=adapter.method)
        if adapter.job_id is None:  # a fine-tune's adapter hangs from its job; a mounted or merged one from its base
            graph.edge(graph.model(adapter.base_model), made)
        for source in adapter_config(Path(adapter.path)).get("merged_from") or []:
            graph.edge(graph.folder("adapter", source, "#/adapters"), made)
    for manifest_path in sorted(home.exports().glob("*/manifest.json"))[-MOST_EXPORTS:]:
        try:
            manifest = read_json(manifest_path, "manifest")
        except (OSError, ValueError):
            continue
        if not isinstance(manifest, dict):
            continue
        export = graph.folder("export", manifest_path.parent, "#/adapters")
        graph.edge(graph.model(manifest.get("base_model")), export)
        graph.edge(graph.folder("adapter", manifest.get("adapter_path"), "#/adapters"), export)
    for model_id in served:
        served_key = graph.node(f"served:{model_id}", "served", model_id, f"#/status/{model_id}")
        graph.edge(graph.model(model_id), served_key)
    return graph.answer()

