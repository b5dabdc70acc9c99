"""What a fine-tune that did not finish leaves: real jobs, run by the worker's own code in this
process (its child a real process), cancelled or left by a worker that died. The newest whole
checkpoint stays as an adapter marked partial; without one the folder goes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT


@pytest.fixture(scope="module")
def db():
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)


def _config(tiny_model: str, tmp_path: Path, save_every: int) -> dict:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    row = {"messages": [{"role": "user", "content": "Say the word."}, {"role": "assistant", "content": "Zebra!"}]}
    (data / "train.jsonl").write_text((json.dumps(row) + "\n") * 4)
    return {"model_dir": tiny_model, "data_dir": str(data), "adapter_path": str(tmp_path / f"adapter-{save_every}"),
            "iters": 100000, "batch_size": 2, "save_every": save_every, "learning_rate": 1e-4}


def _reached(log_path: str, step: int, proc=None) -> None:
    """Wait until the job's event log has a metric of `step` (a checkpoint is saved after it)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if os.path.exists(log_path):
            events = [json.loads(line) for line in open(log_path) if line.strip()]
            assert not [e for e in events if e["type"] in ("failed", "done")], events[-2:]
            if any(e["type"] == "metric" and e["step"] > step for e in events):
                return
        assert proc is None or proc.poll() is None, "the child stopped"
        time.sleep(0.2)
    raise AssertionError(f"step {step} never came")


def _cancelled(job_id: str, step: int):
    """Run the job as a worker does, cancel it once it passed `step`, and answer its row."""
    from django.db import connection

    from jobs import runner, service
    from jobs.models import Job

    def work():
        try:
            runner.run(job_id)
        finally:
            connection.close()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        _reached(Job.objects.get(id=job_id).log_path, step)
    finally:
        assert service.cancel(Job.objects.get(id=job_id))
        worker.join(120)
    assert not worker.is_alive()
    return Job.objects.get(id=job_id)


def _job(config: dict, tmp_path: Path, name: str):
    from jobs.models import Job

    return Job.objects.create(kind="finetune", config_json=json.dumps(config),
                              log_path=str(tmp_path / f"{name}.ndjson"))


def _listed(folder: Path, served: str) -> dict | None:
    """The folder as GET /v1/adapters/available lists it, `served` being the model served."""
    from jobs.adapters import available

    return next((a for a in available([], [served]) if a["path"] == str(folder.resolve())), None)


def _finite(weights: Path) -> bool:
    import mlx.core as mx

    return all(bool(mx.isfinite(w).all()) for w in mx.load(str(weights)).values())


def test_a_cancelled_fine_tune_keeps_its_last_checkpoint_marked_partial_or_nothing(db, tiny_model, tmp_path):
    from core.paths import TRAINING_MARKER
    from jobs.models import Adapter

    config = _config(tiny_model, tmp_path, save_every=2)
    job = _cancelled(_job(config, tmp_path, "saved").id, step=4)
    assert job.status == "cancelled" and job.error == "cancelled by request"
    folder = Path(config["adapter_path"])
    assert not (folder / TRAINING_MARKER).exists()
    partial = json.loads((folder / "adapter_config.json").read_text())["partial"]
    assert partial["ended"] == "cancelled" and partial["job_id"] == job.id and partial["iters"] == 100000
    assert partial["step"] >= 4 and partial["step"] % 2 == 0
    assert (folder / f"{partial['step']:07d}_adapters.safetensors").is_file() and _finite(
        folder / "adapters.safetensors")
    listed = _listed(folder, tiny_model)
    assert listed is not None and listed["partial"] == partial and listed["compatible"]
    assert Adapter.objects.get(path=str(folder.resolve())).job_id == job.id

    config = _config(tiny_model, tmp_path, save_every=100000)  # no checkpoint before the cancel
    job = _cancelled(_job(config, tmp_path, "unsaved").id, step=1)
    assert job.status == "cancelled" and not Path(config["adapter_path"]).exists()


def test_a_fine_tune_whose_worker_died_is_a_zombie_and_keeps_its_checkpoint(db, tiny_model, tmp_path):
    """The worker SIGKILLed takes its child with it; the next worker's sweep marks the job a zombie
    with the reason and settles the folder as a cancel does."""
    from core.paths import TRAINING_MARKER
    from jobs.models import Job
    from jobs.runner import mark_zombies

    config = _config(tiny_model, tmp_path, save_every=2)
    log_path = tmp_path / "zombie.ndjson"
    config_path = tmp_path / "zombie.config.json"
    config_path.write_text(json.dumps(config))
    child = subprocess.Popen([sys.executable, "-m", "jobs.child", "jobs.kinds.finetune", str(log_path),
                              str(config_path)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _reached(str(log_path), 4, child)
    finally:
        child.send_signal(signal.SIGKILL)  # as when its worker is killed (the child dies with it)
        child.wait()
    dead = subprocess.Popen(["true"])
    dead.wait()
    job = Job.objects.create(kind="finetune", status="running", config_json=json.dumps(config),
                             log_path=str(log_path), worker_pid=dead.pid, child_pid=child.pid)
    assert mark_zombies() >= 1
    job.refresh_from_db()
    assert job.status == "zombie" and f"its worker (pid {dead.pid}) stopped while it ran" in job.error
    folder = Path(config["adapter_path"])
    assert not (folder / TRAINING_MARKER).exists() and _finite(folder / "adapters.safetensors")
    listed = _listed(folder, tiny_model)
    assert listed is not None and listed["partial"]["ended"] == "zombie" and listed["partial"]["step"] >= 4


def test_a_fine_tune_over_an_adapter_cancelled_before_a_checkpoint_leaves_that_adapter_whole(db, tiny_model,
                                                                                              tmp_path):
    """The job replaces the folder's config as it begins; with no checkpoint of its own, the adapter that
    was there comes back as it was: its weights untouched, its config put back, listed, not partial."""
    from huggingface_hub import snapshot_download

    from core.paths import CONFIG_BEFORE
    from tests.helpers import random_adapter, write_adapter

    config = _config(tiny_model, tmp_path, save_every=100000)
    folder = write_adapter(Path(config["adapter_path"]),
                           random_adapter(snapshot_download(tiny_model, local_files_only=True), 1, 3), 1.0,
                           tiny_model, layers=1)
    for name in ("adapters.safetensors", "adapter_config.json"):  # trained an hour ago
        os.utime(folder / name, (time.time() - 3600, time.time() - 3600))
    weights, old_config = (folder / "adapters.safetensors").read_bytes(), (folder / "adapter_config.json").read_text()
    job = _cancelled(_job(config, tmp_path, "over").id, step=1)
    assert job.status == "cancelled"
    assert (folder / "adapters.safetensors").read_bytes() == weights
    assert (folder / "adapter_config.json").read_text() == old_config and not (folder / CONFIG_BEFORE).exists()
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapters.safetensors"]


def test_weights_newer_than_the_newest_numbered_checkpoint_are_not_given_its_step(tmp_path):
    """mlx-lm writes adapters.safetensors, then the step's numbered copy: a job that ended between the two
    left weights of a step whose number is not on disk. The newest numbered checkpoint is kept instead."""
    import mlx.core as mx

    from jobs.leftovers import _newest_whole

    def save(name: str, value: float) -> Path:
        path = tmp_path / name
        mx.save_safetensors(str(path), {"w": mx.full((2, 2), value)})
        return path

    four = save("0000004_adapters.safetensors", 4.0)
    time.sleep(0.01)
    weights = save("adapters.safetensors", 6.0)  # step 6's, its numbered copy never written
    assert _newest_whole(weights, [four], [four, weights]) == (4, four)
    time.sleep(0.01)
    six = save("0000006_adapters.safetensors", 6.0)  # both writes of step 6 done
    assert _newest_whole(weights, [six, four], [six, four, weights]) == (6, weights)
