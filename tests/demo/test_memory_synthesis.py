"""Memory synthesis end to end with the demo model: fixture chat sessions
imported into a real `hearth serve`, distilled into a vault by the job
(one commit per writing stage), the dry run's SSE frames, and a job killed
part way through that leaves the vault clean at its last good commit."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers import ServerProcess, server_env

SESSIONS = [
    ("My cat Miso", [("Tell me about my cat Miso.", "Miso is a grey cat who sleeps in the garden shed."),
                     ("What does Miso eat?", "Miso eats fish and chicken.")]),
    ("Leeks", [("I am planting leeks in the raised beds.", "Leeks like deep soil and steady water.")]),
    ("Trip to Lyon", [("We are going to Lyon in May.", "Lyon is a city in France known for its food.")]),
]
WRITING = ("create", "patch", "link", "wikify")


@pytest.fixture(scope="module")
def synth(demo_build, demo_homes, tmp_path_factory):
    home = tmp_path_factory.mktemp("synthesis-home")
    # A second between stages leaves time to kill a run part way through.
    env = dict(server_env(demo_homes[0], home), HEARTH_JOB_STAGE_DELAY="1")
    proc = ServerProcess(env, capped=False, log_path=tmp_path_factory.mktemp("synthesis-log") / "server.log")
    try:
        proc.wait_ready()
        client = httpx.Client(base_url=proc.url, timeout=120)
        assert client.post("/api/memory/init", json={}).json()["ok"]
        yield client, home
    finally:
        assert proc.stop() == 0, proc.output()


def add_session(client, title: str, turns: list[tuple[str, str]]) -> None:
    entries, parent = [{"type": "session", "title": title}], None
    for i, (question, answer) in enumerate(turns):
        entries.append({"type": "message", "id": f"u{i}", "parentId": parent,
                        "message": {"role": "user", "content": question}})
        entries.append({"type": "message", "id": f"a{i}", "parentId": f"u{i}",
                        "message": {"role": "assistant", "content": answer}})
        parent = f"a{i}"
    assert client.post("/api/sessions/import", json={"entries": entries}).json()["ok"]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def wait(client, job_id: str, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/api/jobs/{job_id}").json()["job"]
        if job["status"] in ("done", "failed", "cancelled", "zombie") and job["ended_at"]:
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not end in {timeout}s")


def vault_root(client) -> Path:
    return Path(client.get("/api/memory/status").json()["status"]["root"])


def test_dry_run_streams_every_stage_and_writes_nothing(synth):
    client, _ = synth
    add_session(client, *SESSIONS[0])
    before = git(vault_root(client), "rev-parse", "HEAD")
    frames = []
    with client.stream("GET", "/v1/memory/synthesize", params={"dry": "1"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                frames.append(line[6:])
    assert frames[-1] == "[DONE]"
    events = [json.loads(f) for f in frames[:-1]]
    stages = [e["stage"] for e in events if e["type"] == "stage"]
    assert stages == ["ingest", "segment", "extract", "route", "create", "section-route", "patch", "link", "wikify"]
    assert [e["type"] for e in events[-2:]] == ["done", "summary"] and events[-1]["dry"] is True
    assert any("1 chat session(s)" in e.get("message", "") for e in events if e["type"] == "log")
    assert git(vault_root(client), "rev-parse", "HEAD") == before
    assert client.get("/api/memory/vaults").json()["vaults"][0]["last_synthesized_at"] is None


def test_synthesis_writes_articles_with_one_commit_per_stage(synth):
    client, _ = synth
    for title, turns in SESSIONS[1:]:
        add_session(client, title, turns)
    root = vault_root(client)
    start = git(root, "rev-parse", "HEAD").strip()
    started = client.post("/api/memory/synthesize", json={}).json()
    assert started["ok"] and started["sessions"] == 3
    again = client.post("/api/memory/synthesize", json={})  # one run per vault at a time
    assert again.status_code == 409 and "already" in again.json()["error"]
    job = wait(client, started["job_id"])
    assert job["status"] == "done", job["error"]
    summary = json.loads(job["message"])
    assert summary["created"], summary  # at least one new article
    assert "covered_until" in summary and "coveredUntil" not in summary
    commits = git(root, "log", "--format=%H %s", f"{start}..HEAD").splitlines()[::-1]
    assert [c["hash"] for c in summary["commits"]] == [line.split()[0] for line in commits]
    landed = [c["stage"] for c in summary["commits"]]
    assert landed and "create" in landed and len(landed) == len(set(landed)) and set(landed) <= set(WRITING)
    for (hash_, _), stage in zip((line.split(" ", 1) for line in commits), landed, strict=True):
        assert git(root, "log", "-1", "--format=%s %an", hash_).startswith(f"Synthesis {stage}: ")
    assert git(root, "status", "--porcelain") == ""
    assert len(git(root, "worktree", "list").splitlines()) == 1  # the scratch worktree is gone
    listed = client.get("/api/memory/list").json()["articles"]
    assert set(summary["created"]) <= set(listed)
    article = client.get("/api/memory/article", params={"name": summary["created"][0]}).json()
    assert article["ok"] and "## Sources" in article["content"] and article["infobox"]["entity_kind"]
    found = client.get("/api/memory/search", params={"q": summary["created"][0]}).json()
    assert summary["created"][0] in [s["article"] for s in found["summaries"]]
    vault = client.get("/api/memory/vaults").json()["vaults"][0]
    assert vault["last_synthesized_at"] is not None
    # Nothing new since: the next run reads no sessions and changes nothing.
    job = wait(client, client.post("/api/memory/synthesize", json={}).json()["job_id"])
    assert job["status"] == "done" and json.loads(job["message"])["sessions"] == 0
    assert git(root, "rev-parse", "HEAD").strip() == commits[-1].split()[0]


def test_a_killed_synthesis_leaves_the_vault_at_its_last_good_commit(synth):
    """In a vault of its own with no articles yet, so that the run writes
    whatever the demo model is: every fact it extracts becomes a new article.
    Beside existing articles the model picks where a fact goes, and the demo
    model built on another CPU (its weights follow the BLAS's rounding) put
    the one fact of a new session into an article that already said it: a
    run with nothing to write, and nothing to kill it after."""
    client, home = synth
    add_session(client, "Bees", [("We keep two bee hives by the orchard.", "Bees like the apple blossom.")])
    made = client.post("/api/memory/init", json={"name": "crash"}).json()
    assert made["ok"], made
    root = Path(made["vault"]["root"])
    started = client.post("/api/memory/synthesize", json={"vault": "crash"}).json()
    assert started["ok"] and started["sessions"] >= 1  # a new vault reads every session there is
    job_id = started["job_id"]
    log_path = Path(client.get(f"/api/jobs/{job_id}").json()["job"]["log_path"])
    deadline, landed = time.monotonic() + 600, None
    while landed is None and time.monotonic() < deadline:
        events = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
        landed = next((e for e in events if e["type"] == "commit"), None)
        if any(e["type"] in ("done", "failed") for e in events):
            break
        time.sleep(0.05)
    assert landed is not None, "no stage landed before the run ended"
    with sqlite3.connect(home / "hearth.sqlite3") as db:
        (child,) = db.execute("SELECT child_pid FROM jobs_job WHERE id = ?", (job_id,)).fetchone()
    os.kill(child, signal.SIGKILL)  # a crash mid-run, between stages
    job = wait(client, job_id)
    assert job["status"] == "failed" and "killed" in job["error"]
    assert git(root, "status", "--porcelain") == ""
    assert git(root, "rev-parse", "HEAD").strip() == landed["hash"]
    assert git(root, "log", "-1", "--format=%s").startswith(f"Synthesis {landed['stage']}: ")
    # The next run clears what the killed one left and finishes; the sessions are read again.
    job = wait(client, client.post("/api/memory/synthesize", json={"vault": "crash"}).json()["job_id"])
    assert job["status"] == "done", job["error"]
    assert json.loads(job["message"])["sessions"] == started["sessions"]
    assert git(root, "status", "--porcelain") == "" and len(git(root, "worktree", "list").splitlines()) == 1
