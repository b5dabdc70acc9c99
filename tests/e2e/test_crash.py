"""A server killed with SIGKILL, then started again on the same homes.

The supervised worker dies with its server, and a restarted server stops a
recorded worker that did not (a stray). A server killed mid-fine-tune,
mid-SSD-cache flush and mid-synthesis leaves truthful records (the job says
it did not finish and why; the synthesis run is not counted; the vault is at
its last landed commit with no scratch worktree left), no stray process
and no half-written file that is read later; and the same work then
succeeds. (The killed download is in test_hub.) Every "mid-" window is held
open by a delay knob (HEARTH_JOB_STAGE_DELAY, HEARTH_SSD_WRITE_DELAY), never
by a sleep that races."""
from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.helpers import HEARTH, ROOT, STRAY_WINDOW_S, ServerProcess, assert_no_strays, exited, server_env

pytestmark = pytest.mark.slow  # `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)


def sigkill(server: ServerProcess) -> None:
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    server.stop()  # closes the log


def job_row(home: Path, job_id: str) -> dict:
    """The row as the killed server left it (no server is running to ask)."""
    with sqlite3.connect(home / "hearth.sqlite3") as db:
        db.row_factory = sqlite3.Row
        return dict(db.execute("SELECT * FROM jobs_job WHERE id = ?", (job_id,)).fetchone())


def events(log_path: str | Path) -> list[dict]:
    path = Path(log_path)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def wait_event(log_path: str, matches, timeout: float = 240) -> dict:  # a hang guard, not a time limit
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in events(log_path):
            if matches(event):
                return event
            assert event["type"] not in ("done", "failed"), f"the job ended first: {event}"
        time.sleep(0.05)
    raise AssertionError(f"no matching event in {log_path}: {events(log_path)[-3:]}")


def wait_job(url: str, job_id: str, statuses: tuple = ("done", "failed", "cancelled", "zombie"),
             timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/api/jobs/{job_id}").json()["job"]
        if job["status"] in statuses and job["ended_at"]:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never reached {statuses}: {job}")


def worker_record(home: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = list((home / "run").glob("worker-*.json")) if (home / "run").is_dir() else []
        if records:
            return json.loads(records[0].read_text())
        time.sleep(0.05)
    raise AssertionError("the server recorded no worker")


@pytest.fixture
def crash_home(tmp_path) -> Path:
    return tmp_path / "hearth"


@pytest.fixture
def serve(homes):
    """serve(home, log, *args, **env): a ready server; any a failed test left running is killed."""
    started: list[ServerProcess] = []

    def start(home: Path, log: Path, *args: str, **env) -> ServerProcess:
        server = ServerProcess(dict(server_env(homes[0], home), **env), *args, log_path=log)
        started.append(server)
        return server.wait_ready()

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
        server.stop()


# -- the worker is tied to its server ----------------------------------------------------------
def test_a_supervised_worker_exits_within_seconds_of_its_server_being_killed(serve, tiny_model, crash_home,
                                                                             tmp_path):
    server = serve(crash_home, tmp_path / "server.log", tiny_model)
    record = worker_record(crash_home)
    worker = psutil.Process(record["worker_pid"])
    assert worker.ppid() == server.proc.pid == record["server_pid"]
    assert abs(worker.create_time() - record["worker_started"]) < 0.05 and "hearth.cli worker" in " ".join(
        worker.cmdline())
    deadline = time.monotonic() + 30  # the worker ties itself to the server once Django is up
    while "tied to its server" not in server.output():
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.05)
    sigkill(server)
    killed = time.monotonic()
    took = assert_no_strays(crash_home)
    # A process in the middle of exiting has no command line left to match: the worker is also
    # watched by its pid, until it is gone, within the same window.
    while not exited(worker):
        assert time.monotonic() - killed < STRAY_WINDOW_S, "the worker outlived its server"
        time.sleep(0.05)
    assert took < STRAY_WINDOW_S


WATCHED = """
import os, sys, time
from core import procs
procs.die_with_parent = lambda signum: False  # as on macOS: only the parent watch is left
procs.tie_to_parent(os.getppid())
print(os.getpid(), flush=True)
time.sleep(120)
"""


def test_the_parent_watch_stops_a_process_whose_parent_is_killed():
    """The portable half of the tie (macOS has no parent-death signal)."""
    middle = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               f"{WATCHED!r}])"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    watched = psutil.Process(int(middle.stdout.readline()))
    assert watched.ppid() == middle.pid
    middle.kill()
    middle.wait()
    middle.stdout.close()
    deadline = time.monotonic() + STRAY_WINDOW_S
    while not exited(watched):
        assert time.monotonic() < deadline, "the watched process outlived its parent"
        time.sleep(0.05)


def _hand_worker(homes, home: Path, log: Path, ready: bool = True) -> subprocess.Popen:
    """`hearth worker` as a person starts it beside `hearth serve --no-worker` (once it is ready)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([*HEARTH, "worker"], cwd=ROOT, env=server_env(homes[0], home), stdout=out,
                                stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while ready and "job worker ready" not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.05)
    return proc


def _record(home: Path, pid: int, started: float, server_pid: int, server_started: float) -> Path:
    (home / "run").mkdir(parents=True, exist_ok=True)
    path = home / "run" / f"worker-{pid}.json"
    path.write_text(json.dumps({"worker_pid": pid, "worker_started": started, "server_pid": server_pid,
                                "server_started": server_started}))
    return path


def test_a_restarted_server_stops_a_stray_recorded_worker(serve, homes, tiny_model, crash_home, tmp_path):
    gone = subprocess.Popen(["true"])  # the stray's server: a pid that no longer runs
    gone.wait()
    # A worker whose parent-death signal never came (started without it), recorded as the dead server's.
    stray = _hand_worker(homes, crash_home, tmp_path / "stray.log")  # ready: it made the database
    # A worker started by hand: never recorded, never stopped.
    by_hand = _hand_worker(homes, crash_home, tmp_path / "by-hand.log", ready=False)
    # A record whose pid now belongs to another process (it started later than recorded).
    reused = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        stray_record = _record(crash_home, stray.pid, psutil.Process(stray.pid).create_time(), gone.pid, 1.0)
        reused_record = _record(crash_home, reused.pid, psutil.Process(reused.pid).create_time() - 60, gone.pid, 1.0)
        server = serve(crash_home, tmp_path / "server.log", tiny_model)
        try:
            assert stray.wait(STRAY_WINDOW_S) is not None  # stopped before the new worker started
            assert f"stopped a stray job worker (pid {stray.pid})" in server.output()
            assert by_hand.poll() is None and reused.poll() is None
            assert not stray_record.exists() and not reused_record.exists()
            record = worker_record(crash_home)
            assert record["server_pid"] == server.proc.pid and record["worker_pid"] not in (stray.pid, by_hand.pid)
        finally:
            assert server.stop() == 0, server.output()
        assert not list((crash_home / "run").glob("worker-*.json"))  # a clean stop forgets its worker
        assert by_hand.poll() is None  # still running
    finally:
        for proc in (stray, by_hand, reused):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(15)


def test_an_event_log_cut_mid_line_keeps_the_next_event_whole(tmp_path):
    """A child killed while it appended an event leaves half a line; what the
    worker appends next (the job's end) must still parse."""
    from jobs.events import EventLog

    log = EventLog(tmp_path / "job.ndjson")
    log.emit("started")
    with open(log.path, "ab") as f:
        f.write(b'{"type": "metric", "step": 4')
    assert [e["type"] for e in log.read()[0]] == ["started"]  # the half line waits for its end
    log.emit("failed", error="its worker (pid 1) stopped while it ran")
    read, _ = log.read()
    assert [e["type"] for e in read] == ["started", "log", "failed"]
    assert read[-1]["error"] == "its worker (pid 1) stopped while it ran"


# -- fine-tune ------------------------------------------------------------------------------------
def _finetune_body(data: Path, adapter: Path) -> dict:
    return {"model_dir": "hearth-test/tiny-random", "data_dir": str(data), "adapter_path": str(adapter),
            "iters": 4, "learning_rate": 1e-3, "rank": 8, "batch_size": 4, "steps_per_report": 2}


def _adapter_is_whole(folder: Path) -> bool:
    """An adapter folder is absent, or its weights load completely."""
    import mlx.core as mx

    weights = folder / "adapters.safetensors"
    if not weights.exists():
        return True
    return bool(mx.load(str(weights)))


def test_a_server_killed_mid_fine_tune(serve, tiny_model, crash_home, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    row = json.dumps({"messages": [{"role": "user", "content": "Say the word."},
                                   {"role": "assistant", "content": "Zebra!"}]})
    (data / "train.jsonl").write_text("\n".join([row] * 8) + "\n")
    adapter = tmp_path / "adapter"
    body = _finetune_body(data, adapter)

    # The job pauses at its "train" stage: the server dies while the job runs.
    server = serve(crash_home, tmp_path / "a.log", tiny_model, HEARTH_JOB_STAGE_DELAY="60")
    job_id = httpx.post(server.url + "/api/finetune/submit", json=body).json()["job_id"]
    log_path = httpx.get(f"{server.url}/api/jobs/{job_id}").json()["job"]["log_path"]
    wait_event(log_path, lambda e: e.get("stage") == "train")
    child = job_row(crash_home, job_id)["child_pid"]
    assert psutil.pid_exists(child)
    sigkill(server)
    assert_no_strays(crash_home)  # the worker and the job's child went with the server
    left = job_row(crash_home, job_id)
    assert left["status"] == "running" and left["ended_at"] is None  # nobody could record more
    assert _adapter_is_whole(adapter)

    server = serve(crash_home, tmp_path / "b.log", tiny_model)
    try:
        job = wait_job(server.url, job_id, ("zombie",), timeout=30)
        assert f"its worker (pid {left['worker_pid']}) stopped while it ran" in job["error"] and job["progress"] < 1
        assert events(log_path)[-1] == {**events(log_path)[-1], "type": "failed", "error": job["error"]}
        assert _adapter_is_whole(adapter)
        listed = {a["path"] for a in httpx.get(server.url + "/v1/adapters/available").json()["adapters"]}
        assert str(adapter.resolve()) not in listed  # a killed run registered nothing
        refused = httpx.post(server.url + "/v1/adapters", json={"id": "half", "path": str(adapter)})
        assert refused.status_code in (400, 404, 422), refused.text

        # The same fine-tune, submitted again, finishes and mounts.
        again = httpx.post(server.url + "/api/finetune/submit", json=body).json()["job_id"]
        assert wait_job(server.url, again, timeout=180)["status"] == "done"
        assert _adapter_is_whole(adapter) and (adapter / "adapters.safetensors").is_file()
        mounted = httpx.post(server.url + "/v1/adapters", json={"id": "zebra", "path": str(adapter)})
        assert mounted.status_code == 200 and mounted.json()["mounted_layers"] > 0, mounted.text

        # A weights file cut short (a kill during the trainer's save) never mounts.
        torn = tmp_path / "torn"
        torn.mkdir()
        (torn / "adapter_config.json").write_bytes((adapter / "adapter_config.json").read_bytes())
        whole = (adapter / "adapters.safetensors").read_bytes()
        (torn / "adapters.safetensors").write_bytes(whole[: len(whole) // 2])
        refused = httpx.post(server.url + "/v1/adapters", json={"id": "torn", "path": str(torn)})
        assert refused.status_code in (400, 422), refused.text
        assert "torn" not in {a["id"] for a in httpx.get(server.url + "/v1/adapters").json()["adapters"]}
    finally:
        assert server.stop() == 0, server.output()


# -- the SSD tier of the prompt cache --------------------------------------------------------
PROMPT = "Persist me through a crash. " + " ".join(f"fact {i}: the fox jumps over the dog." for i in range(30))


def _complete(url: str) -> dict:
    r = httpx.post(url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _whole_snapshots(ssd: Path) -> list[dict]:
    """Every snapshot file in the tier, read completely: its tokens and tensor count."""
    from safetensors import safe_open

    out = []
    for path in sorted(ssd.rglob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as f:
            out.append({"tokens": len(json.loads(f.metadata()["tokens"])),
                        "tensors": sum(f.get_tensor(name).size >= 0 for name in f.keys())})
    return out


def test_a_server_killed_mid_cache_flush(serve, tiny_model, crash_home, tmp_path):
    ssd = tmp_path / "ssd"
    args = (tiny_model, "--ssd-cache", str(ssd), "--no-worker")
    # Each snapshot write stops half way through its temp file.
    server = serve(crash_home, tmp_path / "a.log", *args, HEARTH_SSD_WRITE_DELAY="60")
    cold = _complete(server.url)
    flushed: list = []

    def flush():
        try:
            flushed.append(httpx.post(server.url + "/admin/cache/flush", timeout=120))
        except httpx.HTTPError as exc:
            flushed.append(exc)

    flusher = threading.Thread(target=flush)
    flusher.start()
    deadline = time.monotonic() + 30
    while not [t for t in ssd.rglob("*.tmp") if t.stat().st_size > 0]:
        assert time.monotonic() < deadline, "no snapshot write began"
        time.sleep(0.05)
    assert httpx.get(server.url + "/stats").json()["ssd_cache"]["pending_snapshots"] >= 1
    sigkill(server)
    flusher.join(30)
    assert isinstance(flushed[0], httpx.HTTPError)  # the flush never reported success
    [partial] = list(ssd.rglob("*.tmp"))
    assert not list(ssd.rglob("*.safetensors"))
    # A copy cut short under a snapshot's own name (as a crash on a disk that reorders writes could leave).
    torn = partial.parent / "torn.safetensors"
    torn.write_bytes(partial.read_bytes())

    server = serve(crash_home, tmp_path / "b.log", *args)
    try:
        stats = httpx.get(server.url + "/stats").json()["ssd_cache"]
        assert stats["entries"] == 0 and stats["restores"] == 0  # neither the torn file nor the temp one
        assert "skipping torn.safetensors" in server.output()
        assert not partial.exists()  # its writer is gone: the temp file went at start
        warm = _complete(server.url)
        assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        report = httpx.post(server.url + "/admin/cache/flush", timeout=60)
        assert report.status_code == 200 and report.json()["durable"], report.text
        torn.unlink()
        [snapshot] = _whole_snapshots(ssd)
        assert snapshot["tokens"] >= cold["usage"]["prompt_tokens"] - 1 and snapshot["tensors"] > 0
    finally:
        assert server.stop() == 0, server.output()


# -- memory synthesis ------------------------------------------------------------------------------
SESSIONS = [
    ("My cat Miso", [("Tell me about my cat Miso.", "Miso is a grey cat who sleeps in the garden shed."),
                     ("What does Miso eat?", "Miso eats fish and chicken.")]),
    ("Leeks", [("I am planting leeks in the raised beds.", "Leeks like deep soil and steady water.")]),
]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def _vault_state(root: Path) -> dict:
    return {"head": _git(root, "rev-parse", "HEAD").strip(), "log": _git(root, "log", "--format=%H %s"),
            "status": _git(root, "status", "--porcelain", "--untracked-files=all"),
            "files": {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
                      if p.is_file() and ".git" not in p.relative_to(root).parts}}


def _import(url: str, title: str, turns: list[tuple[str, str]]) -> None:
    entries, parent = [{"type": "session", "title": title}], None
    for i, (question, answer) in enumerate(turns):
        entries.append({"type": "message", "id": f"u{i}", "parentId": parent,
                        "message": {"role": "user", "content": question}})
        entries.append({"type": "message", "id": f"a{i}", "parentId": f"u{i}",
                        "message": {"role": "assistant", "content": answer}})
        parent = f"a{i}"
    assert httpx.post(url + "/api/sessions/import", json={"entries": entries}).json()["ok"]


def test_a_server_killed_mid_synthesis(serve, tiny_model, crash_home, tmp_path):
    # Each stage waits 1 s before it runs: the server dies after "create" landed, before the rest.
    server = serve(crash_home, tmp_path / "a.log", tiny_model, HEARTH_JOB_STAGE_DELAY="1")
    assert httpx.post(server.url + "/api/memory/init", json={}).json()["ok"]
    root = Path(httpx.get(server.url + "/api/memory/status").json()["status"]["root"])
    for title, turns in SESSIONS:
        _import(server.url, title, turns)
    job_id = httpx.post(server.url + "/api/memory/synthesize", json={}, timeout=60).json()["job_id"]
    log_path = httpx.get(f"{server.url}/api/jobs/{job_id}").json()["job"]["log_path"]
    landed = wait_event(log_path, lambda e: e["type"] == "commit")
    assert landed["stage"] == "create"
    assert len(_git(root, "worktree", "list").splitlines()) == 2  # the run's scratch worktree
    sigkill(server)
    assert_no_strays(crash_home)
    before = _vault_state(root)
    assert before["head"] == landed["hash"] and before["status"] == ""  # the last landed stage, whole
    assert not (root / ".git" / "index.lock").exists()

    server = serve(crash_home, tmp_path / "b.log", tiny_model)
    try:
        job = wait_job(server.url, job_id, ("zombie",), timeout=30)
        assert "stopped while it ran" in job["error"]
        assert _vault_state(root) == before  # nothing changed, nothing half done
        assert len(_git(root, "worktree", "list").splitlines()) == 1  # the scratch worktree is cleared
        scratch = crash_home / "scratch" / "synthesis"
        assert not [p for p in scratch.rglob("*") if p.is_dir() and p.parent.name == "trees"]
        vault = httpx.get(server.url + "/api/memory/vaults").json()["vaults"][0]
        assert vault["last_synthesized_at"] is None  # the sessions it read are not counted as done
        with sqlite3.connect(crash_home / "hearth.sqlite3") as db:
            (commits,) = db.execute("SELECT commits_json FROM memory_synthesisrun WHERE job_id = ?",
                                    (job_id,)).fetchone()
        assert json.loads(commits) == [{"stage": "create", "hash": landed["hash"]}]

        # The same synthesis runs again and lands.
        again = httpx.post(server.url + "/api/memory/synthesize", json={}, timeout=60).json()
        assert again["ok"] and again["sessions"] == len(SESSIONS)
        job = wait_job(server.url, again["job_id"], timeout=180)
        assert job["status"] == "done", job["error"]
        summary = json.loads(job["message"])
        assert summary["sessions"] == len(SESSIONS) and summary["commits"]
        after = _vault_state(root)
        assert after["status"] == "" and after["log"].endswith(before["log"])
        assert after["head"] == summary["commits"][-1]["hash"]
        assert len(_git(root, "worktree", "list").splitlines()) == 1
        assert httpx.get(server.url + "/api/memory/vaults").json()["vaults"][0]["last_synthesized_at"]
    finally:
        assert server.stop() == 0, server.output()
