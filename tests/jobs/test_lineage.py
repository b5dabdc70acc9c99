"""GET /api/lineage (jobs/lineage.py), in-process: the library's lineage
from the jobs, adapters and exports Hearth keeps, as the Lineage page
(`/dag`) draws it: base model -> dataset -> fine-tune job -> adapter ->
merged, exported or quantized model -> served, each node with its page."""
from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def app(served):
    return served("--no-worker")


def _edges(answer: dict) -> set[tuple[str, str]]:
    return {(e["source"], e["target"]) for e in answer["edges"]}


def test_lineage_follows_a_model_through_its_jobs_to_what_serves_it(app, tiny_model, tmp_path):
    from core import home
    from jobs.models import Adapter, Job

    data, adapter, other = tmp_path / "data", tmp_path / "adapter", tmp_path / "other"
    merged = tmp_path / "merged"
    for folder in (data, adapter, other, merged):
        folder.mkdir()
    (merged / "adapter_config.json").write_text(json.dumps({"method": "merge", "base_model": tiny_model,
                                                            "merged_from": [str(adapter), str(other)]}))
    built = Job.objects.create(kind="dataset", status="done", config_json="{}", log_path="-", output_path=str(data))
    tuned = Job.objects.create(kind="finetune", status="running", log_path="-", config_json=json.dumps(
        {"model_dir": tiny_model, "data_dir": str(data), "adapter_path": str(adapter)}))
    shrunk = Job.objects.create(kind="quantize", status="done", log_path="-", config_json=json.dumps(
        {"model_id": tiny_model, "bits": 4}), message=json.dumps({"repo_id": f"{tiny_model}-hearth-4bit"}))
    failed = Job.objects.create(kind="quantize", status="failed", log_path="-", config_json=json.dumps(
        {"model_id": tiny_model, "bits": 3}), error="bits")
    Adapter.objects.create(name="tuned", path=str(adapter), base_model=tiny_model, method="sft", job=tuned)
    Adapter.objects.create(name="other", path=str(other), base_model=tiny_model, method="sft")
    Adapter.objects.create(name="merged", path=str(merged), base_model=tiny_model, method="merge")
    export = home.exports() / "export-lineage-test"
    export.mkdir(parents=True, exist_ok=True)
    (export / "manifest.json").write_text(json.dumps({"base_model": tiny_model, "adapter_path": str(merged)}))
    built_id, tuned_id, shrunk_id, failed_id = built.id, tuned.id, shrunk.id, failed.id
    try:
        answer = app.get("/api/lineage").json()
    finally:
        for job in (built, tuned, shrunk, failed):
            job.delete()
        Adapter.objects.filter(path__in=[str(adapter), str(other), str(merged)]).delete()
        (export / "manifest.json").unlink()
        export.rmdir()
    assert answer["ok"] is True
    nodes = {n["id"]: n for n in answer["nodes"]}
    base = f"model:{tiny_model}"
    data_node, adapter_node, merged_node = f"dataset:{data}", f"adapter:{adapter}", f"adapter:{merged}"
    assert nodes[base]["kind"] == "model" and nodes[base]["in_library"] is True and nodes[base]["href"] == "#/models"
    assert {(f"job:{built_id}", data_node), (base, f"job:{tuned_id}"), (data_node, f"job:{tuned_id}"),
            (f"job:{tuned_id}", adapter_node), (base, f"job:{shrunk_id}"),
            (f"job:{shrunk_id}", f"model:{tiny_model}-hearth-4bit"), (base, f"job:{failed_id}"),
            (adapter_node, merged_node), (f"adapter:{other}", merged_node), (base, f"adapter:{other}"),
            (merged_node, f"export:{export}"), (base, f"export:{export}"),
            (base, f"served:{tiny_model}")} <= _edges(answer)
    assert (base, adapter_node) not in _edges(answer)  # a fine-tune's adapter hangs from its job, not its base
    assert not any(t.endswith("-hearth-3bit") for _, t in _edges(answer))  # a failed job made nothing
    job = nodes[f"job:{tuned_id}"]
    assert job["href"] == f"#/jobs/{tuned_id}" and job["status"] == "running" and job["job_kind"] == "finetune"
    assert nodes[adapter_node]["label"] == "tuned" and nodes[adapter_node]["href"] == "#/adapters"
    assert nodes[f"served:{tiny_model}"]["href"] == f"#/status/{tiny_model}"  # that model's cards
    assert nodes[f"model:{tiny_model}-hearth-4bit"]["derived"] is True


def test_dag_is_the_lineage_page(app):
    moved = app.get("/dag", follow_redirects=False)
    assert moved.status_code == 302 and moved.headers["location"] == "/#/lineage"
