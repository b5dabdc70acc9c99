"""Jobs with large settings, in this process: a dataset job whose pasted
rows are larger than one command-line argument runs (its child reads
its settings from a file); settings over 1 MiB are a 400 naming the field
that holds them; the job listing and the lineage stay small however large
the jobs' settings are (the whole settings are one job's route away)."""
from __future__ import annotations

import json

import pytest

ARG_MAX = 128 * 1024  # Linux's cap on one argument of a command line (MAX_ARG_STRLEN)
LISTING_MAX = 256 * 1024  # bytes: the listing of a few jobs, with small settings or none


def _rows(count: int) -> str:
    return "question,answer\n" + "".join(f"What is {i} plus {i}?,{2 * i}\n" for i in range(count))


@pytest.fixture(scope="module")
def app(inproc):
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    return inproc


def test_a_dataset_job_with_rows_over_an_argument_s_limit_runs(app):
    from jobs import runner

    rows = _rows(8000)
    assert len(rows) > ARG_MAX
    r = app.post("/api/dataset/submit", json={"template_id": "table-to-messages",
                                              "inputs": {"data": rows, "valid_fraction": 0}})
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    runner.run(job_id)  # as the worker runs it: the job's child does the work
    job = app.get(f"/api/jobs/{job_id}").json()["job"]
    assert job["status"] == "done", job["error"]
    assert json.loads(job["message"])["n_train"] == 8000
    assert json.loads(job["config_json"])["inputs"]["data"] == rows


def test_the_listing_and_the_lineage_leave_large_settings_out(app):
    too_many = app.post("/api/dataset/submit", json={"template_id": "table-to-messages",
                                                      "inputs": {"data": _rows(60_000)}})  # 1.8 MB
    assert too_many.status_code == 400 and too_many.json()["error"].startswith("inputs.data: ")
    rows = _rows(20_000)  # 0.6 MB of pasted rows, queued (no worker runs here)
    ids = [app.post("/api/dataset/submit", json={"template_id": "table-to-messages",
                                                 "inputs": {"data": rows}}).json()["job_id"] for _ in range(3)]
    listed = app.get("/api/jobs")
    assert listed.status_code == 200 and len(listed.content) < LISTING_MAX
    by_id = {job["id"]: job for job in listed.json()["jobs"]}
    for job_id in ids:
        whole = app.get(f"/api/jobs/{job_id}").json()["job"]["config_json"]  # one job's route gives it whole
        assert json.loads(whole)["inputs"]["data"] == rows
        assert json.loads(by_id[job_id]["config_json"]) == {"elided": len(whole)}
    small = app.post("/api/dataset/submit", json={"template_id": "table-to-messages",
                                                  "inputs": {"data": _rows(3)}}).json()["job_id"]
    assert json.loads({j["id"]: j for j in app.get("/api/jobs").json()["jobs"]}[small]["config_json"])[
        "inputs"]["data"] == _rows(3)
    lineage = app.get("/api/lineage")
    assert lineage.status_code == 200 and len(lineage.content) < LISTING_MAX
    assert {f"job:{job_id}" for job_id in ids} <= {node["id"] for node in lineage.json()["nodes"]}
