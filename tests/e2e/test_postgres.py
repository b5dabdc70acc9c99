"""Hearth on PostgreSQL (DATABASE_URL) against a real server from Debian's
packages (tests/pg.py): the settings, every migration forwards and back, and
a real `hearth serve` with its supervised `hearth worker` whose jobs, chat
socket, sessions, vaults and downloads all keep their rows in PostgreSQL and
none in a SQLite file."""
from __future__ import annotations

import asyncio
import json
import runpy
import subprocess
import sys
import time

import httpx
import pytest
import websockets

from tests.helpers import ROOT, ServerProcess, server_env

pytestmark = pytest.mark.slow  # `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)

SETTINGS = str(ROOT / "config" / "settings.py")


def _settings(monkeypatch, url: str) -> dict:
    monkeypatch.setenv("DATABASE_URL", url)
    return runpy.run_path(SETTINGS)["DATABASES"]["default"]


def test_database_url_selects_postgresql_and_refuses_what_it_cannot_use(monkeypatch):
    db = _settings(monkeypatch, "postgresql://ana:s%40cret@db.example:6543/hearth")
    assert db["ENGINE"] == "django.db.backends.postgresql" and db["CONN_MAX_AGE"] == 0
    assert (db["NAME"], db["USER"], db["PASSWORD"], db["HOST"], db["PORT"]) == (
        "hearth", "ana", "s@cret", "db.example", 6543)
    assert _settings(monkeypatch, "postgres://h/x")["ENGINE"] == "django.db.backends.postgresql"
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="must be a postgresql:// URL"):
        _settings(monkeypatch, "mysql://h/x")
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the extra were not installed
    with pytest.raises(ImproperlyConfigured, match=r"pip install 'hearth\[postgres\]'"):
        _settings(monkeypatch, "postgresql://h/x")
    monkeypatch.delenv("DATABASE_URL")
    assert runpy.run_path(SETTINGS)["DATABASES"]["default"]["ENGINE"] == "django.db.backends.sqlite3"


MIGRATE_BOTH_WAYS = """
import django
from django.core.management import call_command
django.setup()
call_command("migrate", interactive=False, verbosity=0)
for app in ("memory", "chat", "jobs", "hub"):  # dependents first
    call_command("migrate", app, "zero", interactive=False, verbosity=0)
call_command("migrate", interactive=False, verbosity=0)
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
executor = MigrationExecutor(connection)
assert not executor.migration_plan(executor.loader.graph.leaf_nodes()), "migrations left unapplied"
"""


def test_every_migration_runs_forwards_and_back(postgres, homes, tmp_path):
    url = postgres.create_database("migrations")
    env = dict(server_env(homes[0], tmp_path / "home"), DATABASE_URL=url)
    done = subprocess.run([sys.executable, "-c", MIGRATE_BOTH_WAYS], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    applied = {app for (app,) in postgres.query("migrations", "SELECT DISTINCT app FROM django_migrations")}
    assert {"jobs", "chat", "hub", "memory", "auth", "sessions"} <= applied
    tables = {t for (t,) in postgres.query("migrations", "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"jobs_job", "jobs_adapter", "chat_chatsession", "chat_chatentry", "chat_toolapproval", "hub_download",
            "memory_memoryvault", "memory_synthesisrun"} <= tables
    assert not (tmp_path / "home" / "hearth.sqlite3").exists()


@pytest.fixture(scope="module")
def pg_server(postgres, homes, tiny_model, tmp_path_factory):
    """`hearth serve` (and the worker it supervises) on a PostgreSQL database of
    its own; each job stage pauses 2 s, so a running job can be cancelled."""
    home = tmp_path_factory.mktemp("pg-home")
    env = dict(server_env(homes[0], home), DATABASE_URL=postgres.create_database("serve"),
               HEARTH_JOB_STAGE_DELAY="2")
    proc = ServerProcess(env, tiny_model, log_path=tmp_path_factory.mktemp("logs") / "pg-server.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()
    assert not (home / "hearth.sqlite3").exists()  # every row went to PostgreSQL


async def _frames_until(ws, kind: str) -> list[dict]:
    frames = []
    while True:
        frames.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
        if frames[-1]["type"] == kind:
            return frames


def test_the_chat_socket_stores_forks_and_deletes_on_postgresql(pg_server, postgres):
    async def run() -> tuple[str, str]:
        async with websockets.connect(pg_server.url.replace("http://", "ws://") + "/ws/chat") as ws:
            await _frames_until(ws, "sessions")
            await ws.send(json.dumps({"type": "set_sampling", "temperature": 0, "scope": "session"}))
            # PostgreSQL text holds no NUL: it is stored as U+FFFD (SQLite keeps it).
            await ws.send(json.dumps({"type": "prompt", "text": "rosemary\u0000stew"}))
            frames = await _frames_until(ws, "turn_end")
            assert not [f for f in frames if f["type"] == "error"], frames
            session = [f for f in frames if f["type"] == "sessions"][-1]["activePath"]
            await ws.send(json.dumps({"type": "open_session", "path": session}))
            history = json.loads(await ws.recv())
            assert [i["content"] for i in history["items"]][:1] == ["rosemary\ufffdstew"]
            assert [i["role"] for i in history["items"]] == ["user", "assistant"]
            await _frames_until(ws, "sessions")
            # A connection PostgreSQL drops (a restart, an idle timeout) is replaced at the next frame.
            postgres.query("serve", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE datname = 'serve' AND pid <> pg_backend_pid()")
            await ws.send(json.dumps({"type": "fork_session", "path": session}))
            fork = json.loads(await ws.recv())
            assert fork["sessionId"] != session and [i["role"] for i in fork["items"]] == ["user", "assistant"]
            await _frames_until(ws, "sessions")
            await ws.send(json.dumps({"type": "delete_session", "path": fork["sessionId"]}))
            listed = (await _frames_until(ws, "sessions"))[-1]
            if fork["sessionId"] in {s["path"] for s in listed["items"]}:
                listed = (await _frames_until(ws, "sessions"))[-1]
            assert fork["sessionId"] not in {s["path"] for s in listed["items"]}
            return session, fork["sessionId"]

    session, fork = asyncio.run(run())
    stored = dict(postgres.query("serve", "SELECT id, title FROM chat_chatsession"))
    assert session in stored and fork not in stored
    roles = postgres.query("serve", "SELECT role FROM chat_chatentry WHERE session_id = %s ORDER BY created_at",
                           (session,))
    assert [r for (r,) in roles] == ["user", "assistant"]
    found = httpx.get(pg_server.url + "/api/sessions/search", params={"q": "ROSEMARY"}).json()
    assert [r["session_path"] for r in found["results"]] == [session]
    exported = httpx.get(pg_server.url + "/api/sessions/export", params={"path": session}).json()
    assert [e["message"]["role"] for e in exported["entries"][1:]] == ["user", "assistant"]


def test_vaults_and_downloads_keep_their_rows_in_postgresql(pg_server, postgres):
    made = httpx.post(pg_server.url + "/api/memory/init", json={}, timeout=60).json()
    assert made["ok"] and made["vault"]["default"], made
    assert postgres.query("serve", "SELECT name, is_default FROM memory_memoryvault") == [
        (made["vault"]["name"], True)]
    too_long = httpx.post(pg_server.url + "/api/hub/download", json={"repo": "nobody/" + "n" * 256})
    assert too_long.status_code == 400 and too_long.json()["error"].startswith("repo: String should have at most 256")
    branch = "release/" + "r" * 100  # as long as a revision may be, longer than a varchar(64)
    started = httpx.post(pg_server.url + "/api/hub/download", json={"repo": "nobody/nothing", "revision": branch})
    assert started.json()["ok"], started.text
    deadline = time.monotonic() + 30
    while (rows := postgres.query("serve", "SELECT state, error, revision FROM hub_download"))[0][0] != "error":
        assert time.monotonic() < deadline, rows
        time.sleep(0.2)
    assert "HF_HUB_OFFLINE" in rows[0][1] and rows[0][2] == branch


def _job(server, job_id: str) -> dict:
    return httpx.get(f"{server.url}/api/jobs/{job_id}").json()["job"]


def _wait(server, job_id: str, done, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while not done(job := _job(server, job_id)):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    return job


def test_jobs_submit_stream_and_cancel_on_postgresql(pg_server, postgres):
    """Last in the module, so the worker started while the other tests ran. Dataset jobs: their
    child imports no MLX, so the job's rows, not the work, take the time."""
    rows = "question,answer\n" + "".join(f"What is {i}+{i}?,{2 * i}\n" for i in range(10))
    body = {"template_id": "table-to-messages", "inputs": {"data": rows, "valid_fraction": 0.2}}
    first = httpx.post(pg_server.url + "/api/dataset/submit", json=body).json()
    second = httpx.post(pg_server.url + "/api/dataset/submit", json=body).json()
    assert first["ok"] and second["ok"]
    _wait(pg_server, second["job_id"], lambda j: j["status"] == "running")
    cancelled = httpx.post(f"{pg_server.url}/api/jobs/{second['job_id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["job"]["status"] == "cancelled"

    events = []
    with httpx.stream("GET", f"{pg_server.url}/api/jobs/{first['job_id']}/stream", timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: {}":
                events.append(json.loads(line[5:]))
    kinds = [e["type"] for e in events]
    assert kinds[0] == "started" and "stage" in kinds and kinds[-1] == "done", events
    assert events[-1]["summary"]["n_train"] == 8
    job = _job(pg_server, first["job_id"])
    assert job["status"] == "done" and job["progress"] == 1.0 and job["output_path"] == first["output_dir"]
    ended = _wait(pg_server, second["job_id"], lambda j: j["ended_at"])
    assert ended["status"] == "cancelled" and ended["error"] == "cancelled by request"
    assert httpx.post(f"{pg_server.url}/api/jobs/{second['job_id']}/cancel").status_code == 409
    stored = dict(postgres.query("serve", "SELECT id, status FROM jobs_job WHERE kind = 'dataset'"))
    assert stored == {first["job_id"]: "done", second["job_id"]: "cancelled"}
    listed = httpx.get(pg_server.url + "/api/jobs?kind=dataset&limit=5").json()["jobs"]
    assert [j["id"] for j in listed] == [second["job_id"], first["job_id"]]  # newest first
