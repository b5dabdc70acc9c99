"""`hearth serve` as a process: start-up errors, disconnects, graceful stop."""
import subprocess
import threading
import time

import httpx

from tests.helpers import HEARTH, ROOT, ServerProcess, server_env

LONG = {"prompt": "Hello", "max_tokens": 100000, "stream": True}


def _stats(base_url):
    return httpx.get(base_url + "/stats").json()["engine"]


def test_unknown_model_is_a_clear_error_not_a_download(homes):
    started = time.monotonic()
    done = subprocess.run([*HEARTH, "serve", "nobody/no-such-model", "--port", "1"], cwd=ROOT,
                          env=server_env(*homes), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "nobody/no-such-model" in done.stderr and "never downloads" in done.stderr
    assert time.monotonic() - started < 60


def test_missing_directory_is_a_clear_error(homes, tmp_path):
    done = subprocess.run([*HEARTH, "serve", str(tmp_path), "--port", "1"], cwd=ROOT,
                          env=server_env(*homes), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "has no config.json" in done.stderr


def test_bad_flag_values_are_refused(homes):
    done = subprocess.run([*HEARTH, "serve", "--top-p", "3"], cwd=ROOT, env=server_env(*homes),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--top-p" in done.stderr


def test_client_disconnect_stops_generation(base_url, eos_id):
    body = {**LONG, "logit_bias": {str(eos_id): -100}}
    with httpx.stream("POST", base_url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        for _ in range(10):
            next(lines)
        assert _stats(base_url)["active"] == 1
    # The connection is closed here; the engine must go idle within a second.
    deadline = time.monotonic() + 1.0
    while _stats(base_url)["active"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _stats(base_url)["active"] == 0
    before = _stats(base_url)["generated_tokens_total"]
    time.sleep(0.3)
    assert _stats(base_url)["generated_tokens_total"] == before


def test_sigterm_finishes_running_requests_then_exits_zero(homes, tiny_model, tmp_path, eos_id):
    """A generating request is finished; a request still waiting for its
    grammar to compile is answered at once (503), its compile killed: the
    drain never waits on a compile (a 60 s budget cannot explain the answer)."""
    env = dict(server_env(*homes), HEARTH_GRAMMAR_TIMEOUT="60")
    proc = ServerProcess(env, tiny_model, "--no-worker", "--drain-seconds", "60", "--max-grammar-choices", "100000",
                         "--max-grammar-bytes", "4MiB", log_path=tmp_path / "serve.log").wait_ready()
    result = {}

    def stream():
        body = {"prompt": "Hi", "max_tokens": 300, "stream": True, "logit_bias": {str(eos_id): -100}}
        result["raw"] = httpx.post(proc.url + "/v1/completions", json=body, timeout=60).text

    def constrained():
        body = {"messages": [{"role": "user", "content": "Pick"}], "max_tokens": 4,
                "guided_choice": [f"option {i} of very many" for i in range(60_000)]}
        result["grammar"] = httpx.post(proc.url + "/v1/chat/completions", json=body, timeout=120)
        result["grammar_at"] = time.monotonic()

    def until(what: str, check) -> None:
        deadline = time.monotonic() + 60
        while not check(httpx.get(proc.url + "/stats").json()):
            assert time.monotonic() < deadline, f"never: {what}"
            time.sleep(0.02)

    workers = [threading.Thread(target=constrained), threading.Thread(target=stream)]
    workers[0].start()  # the compile first (its process takes a while to start), then the generation
    until("a grammar compiling in its process", lambda s: s["grammar"]["workers"] and s["grammar"]["compiling"])
    workers[1].start()
    until("a generation running", lambda s: s["engine"]["active"])
    stopped_at = time.monotonic()
    code = proc.stop(timeout=60)
    for worker in workers:
        worker.join(10)
    assert code == 0, proc.output()
    assert result["raw"].endswith("data: [DONE]\n\n")
    assert '"completion_tokens": 300' in result["raw"]
    assert "shutting down" in proc.output()
    stopped = result["grammar"]
    assert stopped.status_code == 503 and stopped.json()["error"]["code"] == "server_stopping", stopped.text
    assert result["grammar_at"] - stopped_at < 15  # not its 60 s budget


def test_grammar_switched_off_degrades_every_constraint_and_sigterm_while_idle_exits_promptly(homes, tiny_model,
                                                                                            tmp_path):
    """One server (with its worker) for both: a constraint degraded with HEARTH_GRAMMAR=0, then a
    SIGTERM once it is idle again."""
    env = dict(server_env(*homes), HEARTH_GRAMMAR="0")
    proc = ServerProcess(env, tiny_model, log_path=tmp_path / "serve.log").wait_ready()
    try:
        body = {"messages": [{"role": "user", "content": "Yes or no?"}], "max_tokens": 2}
        plain = httpx.post(proc.url + "/v1/chat/completions", json=body).json()
        r = httpx.post(proc.url + "/v1/chat/completions", json={**body, "guided_choice": ["yes", "no"]})
        assert r.status_code == 200
        assert r.headers["warning"] == "grammar not enforced: grammar compilation disabled by HEARTH_GRAMMAR=0"
        assert r.json()["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]
    finally:
        started = time.monotonic()
        assert proc.stop(timeout=20) == 0
    assert time.monotonic() - started < 10
    assert "Hearth serving hearth-test/tiny-random at http://127.0.0.1:" in proc.output()


def test_malformed_setting_stops_start_up(homes, tiny_model):
    env = dict(server_env(*homes), HEARTH_GRAMMAR="maybe")
    done = subprocess.run([*HEARTH, "serve", tiny_model, "--port", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "HEARTH_GRAMMAR" in done.stderr
