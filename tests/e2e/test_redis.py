"""Hearth on a real Redis (the session's Debian redis-server): two `hearth
worker` processes, named as two hosts, drain one queue beside a web node,
all sharing one HEARTH_HOME (the database and the artifacts); job events go
through a Redis stream that a second web node follows; a stored Responses
turn made on one node continues on the other; the chat socket runs over the
channels-redis layer; and a killed worker's job is made a zombie, with a
reason, by the worker that lives."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.helpers import HEARTH, ROOT, ServerProcess, follow_job, server_env, wait_job_status

pytestmark = pytest.mark.slow  # `make check-slow`, which CI runs after `make test` (docs/contributing/tests.md)

HEARTBEAT_S = 0.5
STAGE_DELAY_S = 4  # fine-tunes pause this long once training starts: long enough to overlap, or to be killed


class Worker:
    """`hearth worker --workers 1` as a child process, named HOST in Redis."""

    def __init__(self, env: dict, host: str, log_path: Path):
        self.host, self.log_path = host, log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([*HEARTH, "worker", "--workers", "1"], cwd=ROOT,
                                     env=dict(env, HEARTH_WORKER_HOST=host), stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, client: redis.Redis) -> "Worker":
        deadline = time.monotonic() + 120
        while not client.exists(f"hearth:worker:{self.host}:{self.proc.pid}"):  # its first heartbeat: ready
            assert self.proc.poll() is None, self.log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, self.log_path.read_text(errors="replace")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="module")
def cluster(redis_url, homes, tiny_model, tmp_path_factory):
    """Web nodes A and B (no worker of their own) and two workers on one Redis and one HEARTH_HOME."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    home = tmp_path_factory.mktemp("shared-home")
    logs = tmp_path_factory.mktemp("redis-logs")
    env = dict(server_env(homes[0], home), HEARTH_REDIS_URL=redis_url, HEARTH_WORKER_HEARTBEAT_S=str(HEARTBEAT_S),
               HEARTH_JOB_STAGE_DELAY=str(STAGE_DELAY_S))
    node = ServerProcess(env, tiny_model, "--no-worker", log_path=logs / "node-a.log").wait_ready()
    # The others start together, once node A has migrated the shared database.
    workers = [Worker(env, host, logs / f"{host}.log") for host in ("host-1", "host-2")]
    node_b = ServerProcess(env, tiny_model, "--no-worker", log_path=logs / "node-b.log")
    try:
        for w in workers:
            w.wait_ready(client)
        node_b.wait_ready()
        yield {"node": node, "node_b": node_b, "workers": workers, "home": home, "env": env, "redis": client}
    finally:
        procs = [node.proc, node_b.proc] + [w.proc for w in workers]
        for proc in procs:  # all stop at once, on one SIGTERM each (a second one stops a server at once)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for w in workers:
            w.stop()
        codes = node.stop(), node_b.stop()
        assert codes == (0, 0), node.output() + node_b.output()
        client.close()


@pytest.fixture(scope="module")
def node_b(cluster):
    """The second web node, on the same Redis and database."""
    return cluster["node_b"]


def _rows(home: Path, *ids: str) -> dict[str, dict]:
    with sqlite3.connect(home / "hearth.sqlite3") as db:
        db.row_factory = sqlite3.Row
        rows = db.execute(f"SELECT * FROM jobs_job WHERE id IN ({','.join('?' * len(ids))})", ids).fetchall()
    return {r["id"]: dict(r) for r in rows}


def _finetune(url: str, tiny_model: str, data: Path) -> dict:
    r = httpx.post(url + "/api/finetune/submit", json={"model_dir": tiny_model, "data_dir": str(data), "iters": 4,
                                                       "batch_size": 2, "steps_per_report": 2, "rank": 4})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ft-data")
    row = json.dumps({"messages": [{"role": "user", "content": "Say it."}, {"role": "assistant", "content": "It."}]})
    (folder / "train.jsonl").write_text("\n".join([row] * 4) + "\n")
    (folder / "valid.jsonl").write_text("\n".join([row] * 2) + "\n")
    return folder


def test_two_workers_run_two_finetunes_at_once_into_one_home(cluster, node_b, tiny_model, data):
    node, home, client = cluster["node"], cluster["home"], cluster["redis"]
    jobs = [_finetune(node.url, tiny_model, data) for _ in range(2)]
    _, first = follow_job(node.url, jobs[0]["job_id"], timeout=300)
    _, second = follow_job(node_b.url, jobs[1]["job_id"], timeout=300)  # the other web node streams it from Redis
    for events in (first, second):
        assert events[0]["type"] == "started" and events[-1]["type"] == "done", events[-3:]
        assert [e["step"] for e in events if e["type"] == "metric" and e["kind"] == "train"] == [2, 4]
    rows = _rows(home, *(j["job_id"] for j in jobs))
    a, b = (rows[j["job_id"]] for j in jobs)
    assert a["status"] == b["status"] == "done"
    assert a["worker_pid"] != b["worker_pid"]  # one job each
    assert {a["worker_pid"], b["worker_pid"]} == {w.proc.pid for w in cluster["workers"]}
    assert a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"], (a, b)  # at once
    for job in jobs:
        # The artifacts are in the shared home, where the web node finds them; the events only in Redis.
        adapter = Path(job["adapter_path"])
        assert adapter.parent == home / "adapters" and (adapter / "adapters.safetensors").is_file()
        assert not Path(rows[job["job_id"]]["log_path"]).exists()
        assert client.xlen(f"hearth:job-events:{job['job_id']}") == len(first if job is jobs[0] else second)
        assert not client.exists(f"hearth:job-owner:{job['job_id']}")  # released at the end
    available = {a["path"] for a in httpx.get(node_b.url + "/v1/adapters/available").json()["adapters"]}
    assert {str(Path(j["adapter_path"]).resolve()) for j in jobs} <= available


def test_a_response_stored_on_one_node_continues_on_another(cluster, node_b):
    node, client = cluster["node"], cluster["redis"]
    first = httpx.post(node.url + "/v1/responses", json={"input": "Remember the word kiwi.", "max_output_tokens": 3,
                                                         "temperature": 0}, timeout=60)
    assert first.status_code == 200, first.text
    first = first.json()
    assert client.exists(f"hearth:response:{first['id']}")
    assert httpx.get(f"{node_b.url}/v1/responses/{first['id']}").json() == first
    second = httpx.post(node_b.url + "/v1/responses", json={"input": "Which word?", "max_output_tokens": 3,
                                                            "previous_response_id": first["id"]}, timeout=60)
    assert second.status_code == 200, second.text
    assert second.json()["previous_response_id"] == first["id"]
    # The continued turn holds the first one's input: its prompt is longer than a fresh one.
    fresh = httpx.post(node_b.url + "/v1/responses", json={"input": "Which word?", "max_output_tokens": 3},
                       timeout=60).json()
    assert second.json()["usage"]["input_tokens"] > fresh["usage"]["input_tokens"]
    stats = httpx.get(node.url + "/stats").json()["response_store"]
    assert stats["backend"] == "redis" and stats["entries"] >= 3
    assert httpx.delete(f"{node_b.url}/v1/responses/{first['id']}").status_code == 200
    assert httpx.get(f"{node.url}/v1/responses/{first['id']}").status_code == 404


def _turn(ws, text: str) -> None:
    ws.send(json.dumps({"type": "prompt", "text": text}))
    while (frame := json.loads(ws.recv(timeout=60)))["type"] != "turn_end":
        assert frame["type"] != "error", frame


def _cross_process_group_message(env: dict) -> None:
    """The node's configured layer (a process with its settings) gets a group message sent from another."""
    import asyncio

    from channels_redis.core import RedisChannelLayer

    script = ("import asyncio, django; django.setup()\n"
              "from channels.layers import get_channel_layer\n"
              "async def main():\n"
              "    layer = get_channel_layer()\n"
              "    name = await layer.new_channel()\n"
              "    await layer.group_add('hearth-test', name)\n"
              "    print(type(layer).__name__, flush=True)\n"
              "    print((await asyncio.wait_for(layer.receive(name), 30))['text'], flush=True)\n"
              "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=dict(env, DJANGO_SETTINGS_MODULE="config.settings"))
    try:
        assert proc.stdout.readline().strip() == "RedisChannelLayer"

        async def send():
            layer = RedisChannelLayer(hosts=[env["HEARTH_REDIS_URL"]], prefix="hearth:channels:")
            await layer.group_send("hearth-test", {"type": "note", "text": "from another node"})
            await layer.close_pools()

        asyncio.run(send())
        assert proc.stdout.readline().strip() == "from another node"
    finally:
        proc.kill()
        proc.wait()


def test_the_chat_socket_runs_on_the_redis_channel_layer(cluster):
    from websockets.sync.client import connect

    node = cluster["node"]
    with connect(node.url.replace("http", "ws") + "/ws/chat", open_timeout=30) as ws:
        assert [json.loads(ws.recv(timeout=30))["type"] for _ in range(2)] == ["ready", "sessions"]
        ws.send(json.dumps({"type": "set_sampling", "scope": "session", "temperature": 0, "max_tokens": 4}))
        _turn(ws, "hello")
        idle = time.monotonic()
        _cross_process_group_message(cluster["env"])
        # Idle past the layer's 5 s blocking wait on the socket's channel: the socket stays up.
        time.sleep(max(0.0, 6.0 - (time.monotonic() - idle)))
        _turn(ws, "still there?")


def test_a_killed_worker_leaves_a_zombie_that_the_other_worker_marks(cluster, tiny_model, data):
    node, home, client = cluster["node"], cluster["home"], cluster["redis"]
    job_id = _finetune(node.url, tiny_model, data)["job_id"]
    deadline = time.monotonic() + 120
    with httpx.stream("GET", f"{node.url}/api/jobs/{job_id}/stream", timeout=120) as r:
        for line in r.iter_lines():  # training starts, then the job pauses STAGE_DELAY_S
            if line.startswith("data:") and json.loads(line[5:]).get("stage") == "train":
                break
            assert time.monotonic() < deadline
    pid = _rows(home, job_id)[job_id]["worker_pid"]
    owner = next(w for w in cluster["workers"] if w.proc.pid == pid)
    assert client.get(f"hearth:job-owner:{job_id}").decode() == f"{owner.host}:{pid}"
    time.sleep(HEARTBEAT_S * 4)  # the other worker sweeps meanwhile: a live worker's job is left alone
    assert httpx.get(f"{node.url}/api/jobs/{job_id}").json()["job"]["status"] == "running"
    owner.proc.send_signal(signal.SIGKILL)  # its job's child dies with it
    owner.proc.wait()
    job = wait_job_status(node.url, job_id, ("zombie", "done", "failed"), timeout=30)
    assert job["status"] == "zombie" and f"{owner.host}:{pid}" in job["error"] and "heartbeat" in job["error"]
    _, events = follow_job(node.url, job_id)
    assert events[-1] == {**events[-1], "type": "failed", "error": job["error"]}
    assert not client.exists(f"hearth:job-owner:{job_id}")


def test_sweeps_judge_owners_by_host_pid_and_heartbeat(redis_url, homes, monkeypatch):
    """In this process: which running jobs a sweep on Redis takes for zombies."""
    import django
    from django.core.management import call_command
    from django.test import override_settings

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    from jobs import presence
    from jobs.models import Job
    from jobs.runner import mark_zombies

    client = redis.Redis.from_url(redis_url)
    dead = subprocess.Popen(["true"])
    dead.wait()
    with override_settings(HEARTH_REDIS_URL=redis_url, HEARTH_WORKER_HOST="here", HEARTH_WORKER_HEARTBEAT_S=5):
        logs = homes[1] / "jobs"
        jobs = {name: Job.objects.create(kind="quantize", status="running", worker_pid=pid,
                                         log_path=str(logs / f"sweep-{name}.ndjson"))
                for name, pid in [("alive", 999_999), ("silent", 999_998), ("local", dead.pid),
                                  ("unowned", os.getpid()), ("lost-alive", 999_999), ("lost-silent", 999_997)]}
        # Owner records lost (Redis restarted): another host's jobs are judged by their worker's heartbeat,
        # never by a pid check on this host (999999 lives nowhere here).
        Job.objects.filter(id__in=[jobs["lost-alive"].id, jobs["lost-silent"].id]).update(worker_host="there")
        client.set(f"hearth:worker:there:{999_999}", "{}", px=5000)
        client.set(f"hearth:job-owner:{jobs['alive'].id}", "there:999999")  # another host, beating
        client.set(f"hearth:job-owner:{jobs['silent'].id}", "there:999998")  # another host, no heartbeat
        client.set(f"hearth:job-owner:{jobs['local'].id}", f"here:{dead.pid}")  # this host: its pid is gone
        # "unowned" (no owner recorded) falls back to this host's pid check: this process lives.
        try:
            mark_zombies()
            for job in jobs.values():
                job.refresh_from_db()
            assert jobs["alive"].status == jobs["unowned"].status == jobs["lost-alive"].status == "running"
            assert jobs["lost-silent"].status == "zombie" and "there:999997" in jobs["lost-silent"].error
            assert jobs["silent"].status == "zombie" and "there:999998" in jobs["silent"].error
            assert "no heartbeat" in jobs["silent"].error
            assert jobs["local"].status == "zombie" and f"pid {dead.pid}" in jobs["local"].error
            assert jobs["silent"].event_log().read()[0][-1]["type"] == "failed"  # in its stream, not a file
            assert not Path(jobs["silent"].log_path).exists()
            assert presence.owner(jobs["silent"].id) is None and presence.owner(jobs["alive"].id) == "there:999999"
            # A queue entry delivered twice: the live owner keeps its job; a silent owner's claim is taken over.
            monkeypatch.setattr(presence, "ensure_heartbeat", lambda: None)  # no heartbeat thread in the suite
            assert not presence.claim(jobs["alive"].id)
            client.set(f"hearth:job-owner:{jobs['silent'].id}", "there:999998")
            assert presence.claim(jobs["silent"].id) and presence.owner(jobs["silent"].id) == presence.me()
            presence.release(jobs["alive"].id)  # not this worker's: kept
            assert presence.owner(jobs["alive"].id) == "there:999999"
        finally:
            Job.objects.filter(id__in=[j.id for j in jobs.values()]).update(status="done")
            client.close()


def test_stored_responses_and_event_streams_on_redis(redis_url):
    from inference.protocols.response_store import RedisResponseStore
    from jobs.events import StreamEventLog

    store = RedisResponseStore(redis_url, ttl_s=0.3, max_bytes=400)
    store.put({"id": "resp_a"}, [{"role": "user", "content": "hi"}], [], "be brief", ["sys"])
    got = store.get("resp_a")
    assert got is not None and got.response == {"id": "resp_a"} and got.instructions == "be brief"
    assert got.system == ["sys"]
    store.put({"id": "resp_big"}, [{"role": "user", "content": "x" * 500}], [], None)  # over the cap: not kept
    assert store.get("resp_big") is None
    time.sleep(0.4)
    assert store.get("resp_a") is None  # expired with its time to live
    store.put({"id": "resp_b"}, [], [], None)
    assert store.delete("resp_b") and not store.delete("resp_b")

    log = StreamEventLog("/nowhere/streamtest.ndjson", redis_url)
    assert log.read() == ([], 0)
    log.emit("stage", stage="a")
    first, cursor = log.read()
    log.emit("done", output_dir="/x")
    rest, _ = log.read(cursor)
    assert [e["type"] for e in first] == ["stage"] and [e["type"] for e in rest] == ["done"]
    with pytest.raises(OSError):
        StreamEventLog("/nowhere/x.ndjson", "redis://127.0.0.1:1/0").emit("stage")
