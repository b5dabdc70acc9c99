"""Jobs with large settings, in this process: a dataset job whose pasted
rows are larger than one command-line argument may be runs (its child reads
its settings from a file), and the job listing and the lineage stay small
however large the jobs' settings are (the whole settings are one job's
route away)."""
from __future__ import annotations

import json

import pytest

ARG_MAX = 128 * 1024  # Linux's cap on one argument of a command line (MAX_ARG_STRLEN)


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
