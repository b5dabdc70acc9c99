"""What the job routes take, in this process: a dataset folder is inspected a
row at a time (its memory is that of a row, not of the file; a row is at most 16M characters), a Hugging Face
token is short, a dataset job's inputs are checked at submit as the job
checks them, and the settings file of a job whose worker died does not stay
beside its log."""
from __future__ import annotations

import json
import subprocess
import tracemalloc

import pytest

ROW = {"messages": [{"role": "user", "content": "What is the capital of France? " * 4},
                    {"role": "assistant", "content": "Paris is the capital of France. " * 8}]}


@pytest.fixture(scope="module")
def app(inproc):
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    return inproc


def _inspected(app, folder):
    """inspect-dataset's answer on `folder`, and the most memory this process held for it."""
    tracemalloc.start()
    try:
        r = app.post("/api/finetune/inspect-dataset", json={"path": str(folder)})
        return r, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_dataset_is_inspected_a_row_at_a_time(app, tmp_path):
    line = json.dumps(ROW) + "\n"
    count = (16 << 20) // len(line)  # 16 MB of rows
    (tmp_path / "train.jsonl").write_text(line * count)
    (tmp_path / "valid.jsonl").write_text(line * 3)
    r, peak = _inspected(app, tmp_path)
    assert r.status_code == 200, r.text
    assert r.json() == {"ok": True, "n_train": count, "n_valid": 3, "format": "messages"}
    assert peak < 4 << 20, f"{peak >> 20} MiB held to inspect 16 MB of rows"  # the whole file read was ~50 MiB

    (tmp_path / "valid.jsonl").write_text("")  # none, as the trainer reads it
    assert app.post("/api/finetune/inspect-dataset", json={"path": str(tmp_path)}).json()["n_valid"] == 0
    (tmp_path / "valid.jsonl").write_text(json.dumps({"text": "a"}) + "\n")
    mixed = app.post("/api/finetune/inspect-dataset", json={"path": str(tmp_path)})
    assert mixed.status_code == 422 and "both files need the same format" in mixed.json()["error"]
    (tmp_path / "valid.jsonl").unlink()
    with open(tmp_path / "train.jsonl", "a") as f:
        f.write(json.dumps({"messages": "hi"}) + "\n")
    bad = app.post("/api/finetune/inspect-dataset", json={"path": str(tmp_path)})
    assert bad.status_code == 422 and f"train.jsonl row {count + 1} has no usable 'messages'" in bad.json()["error"]


def test_a_row_longer_than_any_conversation_is_refused_without_reading_it_whole(app, tmp_path):
    from jobs.kinds.training import MAX_ROW_CHARS

    endless = json.dumps({"text": "a" * (4 * MAX_ROW_CHARS)})  # one 64M-character line, no newline
    (tmp_path / "train.jsonl").write_text(json.dumps(ROW) + "\n" + endless)
    r, peak = _inspected(app, tmp_path)
    assert r.status_code == 422 and "train.jsonl line 2 is over 16M characters" in r.json()["error"], r.text[:300]
    assert peak < 3 * MAX_ROW_CHARS, f"{peak >> 20} MiB held"  # the line read whole was 4x the bound, and more


def test_a_hugging_face_token_is_short(app, homes):
    from hub import hf

    before = hf.saved_token()
    try:
        for token in ("x" * (10 << 20), "hf_abc\ndef", "hf_abc def", "hf_é" + "a" * 30):
            r = app.post("/api/settings/hf-token", json={"token": token})
            assert r.status_code == 400 and r.json()["error"].startswith("token: "), r.text[:300]
        assert hf.saved_token() == before  # nothing was written
        assert app.post("/api/settings/hf-token", json={"token": " hf_" + "a" * 34 + "\n"}).status_code == 200
        assert hf.saved_token() == "hf_" + "a" * 34
    finally:
        app.delete("/api/settings/hf-token")


@pytest.mark.parametrize("template, inputs, refusal", [
    ("table-to-messages", {"data": "q,a\n1,2\n", "valid_fraction": 2}, "inputs.valid_fraction: "),
    ("table-to-messages", {"data": "q,a\n1,2\n", "valid_fraction": -0.1}, "inputs.valid_fraction: "),
    ("table-to-messages", {"data": "q,a\n1,2\n", "valid_fraction": "0.1"}, "inputs.valid_fraction: "),
    ("table-to-messages", {"data": "q,a\n1,2\n", "format": "xlsx"}, "inputs.format: "),
    ("table-to-messages", {"data": "q,a\n1,2\n", "valid_fractoin": 0.2}, "inputs.valid_fractoin: "),
    ("table-to-messages", {}, "inputs.data: "),
    ("qa-from-text", {"text": "A passage.", "pairs_per_passage": 0}, "inputs.pairs_per_passage: "),
    ("qa-from-text", {"text": "A passage.", "pairs_per_passage": 2.5}, "inputs.pairs_per_passage: "),
    ("qa-from-text", {"text": "A passage.", "pairs_per_passage": 1000}, "inputs.pairs_per_passage: "),
    ("qa-from-text", {"text": "A passage.", "passage_chars": 10}, "inputs.passage_chars: "),
    ("qa-from-text", {}, "inputs.text: "),
    ("dpo-pairs", {"data": "prompt,chosen\na,b\n", "model_rejects": 0.5}, "inputs.model_rejects: "),
])
def test_dataset_inputs_are_checked_at_submit(app, template, inputs, refusal):
    from jobs.models import Job

    before = Job.objects.count()
    r = app.post("/api/dataset/submit", json={"template_id": template, "inputs": inputs})
    assert r.status_code == 400 and r.json()["error"].startswith(refusal), r.text
    assert Job.objects.count() == before  # no job queued to fail later


def test_dataset_inputs_in_range_are_queued_and_the_job_reads_them(app):
    from jobs import runner

    r = app.post("/api/dataset/submit", json={"template_id": "table-to-messages", "inputs": {
        "data": "question,answer\n" + "".join(f"q{i},a{i}\n" for i in range(10)), "valid_fraction": 0.5,
        "format": "csv"}})
    assert r.status_code == 200, r.text
    runner.run(r.json()["job_id"])
    job = app.get(f"/api/jobs/{r.json()['job_id']}").json()["job"]
    assert job["status"] == "done", job["error"]
    assert json.loads(job["message"])["n_valid"] == 5


def test_the_settings_file_of_a_job_whose_worker_died_is_removed(app, tmp_path):
    """The worker writes a job's settings beside its log and removes them when its child ends; a
    worker killed first leaves them, and the sweep that marks the job a zombie removes them."""
    from jobs.models import Job
    from jobs.runner import mark_zombies, settings_file

    dead = subprocess.Popen(["true"])
    dead.wait()
    jobs = []
    for name in ("zombie", "finished"):
        log_path = tmp_path / f"{name}.ndjson"
        if name == "finished":  # its child wrote its end; only the worker died before recording it
            log_path.write_text(json.dumps({"type": "done", "summary": {}}) + "\n")
        job = Job.objects.create(kind="dataset", status="running", config_json=json.dumps({"inputs": {}}),
                                 log_path=str(log_path), worker_pid=dead.pid)
        settings_file(job).write_text(job.config_json)
        jobs.append(job)
    assert mark_zombies() >= 2
    for job, status in zip(jobs, ("zombie", "done"), strict=True):
        job.refresh_from_db()
        assert job.status == status and not settings_file(job).exists()
        assert json.loads(job.config_json) == {"inputs": {}}  # the row keeps them
