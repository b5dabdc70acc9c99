"""Jobs end to end on the real stack: `hearth serve` with its supervised
worker process, a quantize job followed over SSE whose output loads and
serves, and jobs whose child is killed, that are cancelled, or whose worker
dies mid-run."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.helpers import ServerProcess, follow_job, server_env, wait_job_status


def pids_matching(text: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", text], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out if int(p) != os.getpid()]


def test_quantize_job_streams_to_done_and_its_output_serves(base_url, tiny_model, served):
    inspect = httpx.post(base_url + "/api/quantize/inspect", json={"model_id": tiny_model}).json()
    assert inspect["ok"] and inspect["arch"] == "llama" and inspect["support"] and not inspect["quantized"]
    submitted = httpx.post(base_url + "/api/quantize/submit",
                           json={"model_id": tiny_model, "bits": 4, "group_size": 32}).json()
    assert submitted["ok"] and submitted["output_repo"] == tiny_model + "-hearth-4bit"
    lines, events = follow_job(base_url, submitted["job_id"])
    assert lines[0] == "retry: 1500" and lines[-2:] == ["event: end", "data: {}"]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "done" and "stage" in kinds
    job = httpx.get(f"{base_url}/api/jobs/{submitted['job_id']}").json()["job"]
    assert job["status"] == "done" and job["progress"] == 1.0 and job["ended_at"]
    assert job["output_path"] == events[-1]["output_dir"]
    assert os.path.dirname(os.path.dirname(job["output_path"])) == submitted["output_dir"]  # its snapshot
    listed = httpx.get(base_url + "/api/jobs?kind=quantize&limit=5").json()
    assert listed["ok"] and listed["jobs"][0]["id"] == submitted["job_id"]

    client = served("--no-worker", model=submitted["output_repo"]).openai()
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert reply.usage.completion_tokens >= 1
    config = json.loads(open(os.path.join(job["output_path"], "config.json")).read())
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32


def test_quantize_to_a_bits_per_weight_target_mixes_widths(base_url, tiny_model):
    from huggingface_hub import snapshot_download
    from mlx_lm import generate, load
    from mlx_lm.utils import compute_bits_per_weight

    body = {"model_id": tiny_model, "target_bpw": 7, "candidate_bits": [4, 8], "group_size": 32}
    submitted = httpx.post(base_url + "/api/quantize/submit", json=body).json()
    assert submitted["output_repo"] == tiny_model + "-hearth-mixed-7bpw"
    _, events = follow_job(base_url, submitted["job_id"])
    assert events[-1]["type"] == "done", events[-3:]
    summary = events[-1]["summary"]
    assert summary["target_bpw"] == 7 and set(summary["layers_by_bits"]) == {"4", "8"}
    model, tokenizer = load(snapshot_download(submitted["output_repo"], local_files_only=True))
    achieved = compute_bits_per_weight(model)
    assert 6.0 < achieved <= 7.0 and abs(achieved - summary["planned_bpw"]) < 0.05, (achieved, summary)
    assert generate(model, tokenizer, "hello", max_tokens=4, verbose=False) is not None


@pytest.mark.parametrize("body, needle", [
    ({}, "model_id: Field required"), ({"model_id": "nobody/nothing"}, "neither a directory"),
    ({"model_id": "x/y", "bits": "4"}, "bits: Input should be a valid integer"),
    ({"model_id": "x/y", "learning_rate": 1e-4}, "learning_rate: Extra inputs are not permitted"),
    ({"model_id": "x/y", "bits": 7}, "bits must be"), ({"model_id": "x/y", "group_size": 48}, "group_size"),
    ({"model_id": "x/y", "target_bpw": 0.5}, "target_bpw must be"),
    ({"model_id": "x/y", "target_bpw": 3, "candidate_bits": [4, 7]}, "candidate_bits"),
    ({"model_id": "x/y", "rotate_weights": True}, "rotate_weights"),
    ({"model_id": "x/y", "calibration_mix": "wiki"}, "calibration_mix: Extra inputs are not permitted"),
    ({"model_id": "x/y", "method": "dwq"}, "method must be one of rtn, gptq, awq"),
    ({"model_id": "x/y", "method": "gptq"}, "calibration_data is required with method gptq"),
    ({"model_id": "x/y", "method": "gptq", "bits": 3, "calibration_data": "x"}, "bits must be one of 2, 4, 8"),
    ({"model_id": "x/y", "method": "awq", "calibration_data": "/etc/hostname"}, "calibration_data"),
    ({"model_id": "x/y", "method": "awq", "calibration_data": "x", "target_bpw": 3}, "target_bpw: mixed"),
    ({"model_id": "x/y", "n_calibration": 8}, "n_calibration is for a calibrated method"),
    ({"model_id": "x/y", "method": "gptq", "calibration_data": "x", "sequence_length": 8}, "sequence_length must"),
])
def test_quantize_submit_refusals(base_url, body, needle):
    r = httpx.post(base_url + "/api/quantize/submit", json=body)
    assert r.status_code == 400 and not r.json()["ok"] and needle in r.json()["error"]


HELD_OUT = " ".join(f"The {a} number {i} walks to the {b} market." for i, (a, b) in
                    enumerate(zip(["small", "green", "red", "blue"] * 50, ["new", "big", "old"] * 60, strict=False)))


def test_calibrated_quantization_stays_closer_to_the_model_than_rounding(base_url, tiny_model, homes, tmp_path):
    """GPTQ and AWQ (mlx-lm's own) on the caller's text: at 2 bits, their
    predictions on text they never saw stay much nearer the float model's
    than plain rounding's (measured: KL 0.03 and 0.08 against 0.30)."""
    import mlx.core as mx
    import mlx.nn as nn
    from huggingface_hub import snapshot_download
    from mlx_lm import convert, load

    data = homes[1] / "datasets" / "calibration.jsonl"  # a dataset file, as the dataset builder writes them
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Where does the {a} number {i} go?"},
                                                     {"role": "assistant", "content": f"To the {b} market."}]}) + "\n"
                            for i, (a, b) in enumerate(zip(["red", "blue", "green", "small"] * 100,
                                                           ["old", "new", "big"] * 134, strict=False))))
    src = snapshot_download(tiny_model, local_files_only=True)
    model, tokenizer = load(src)
    tokens = mx.array(tokenizer.encode(HELD_OUT)[:512])[None]
    reference = nn.log_softmax(model(tokens), -1)

    def kl(path: str) -> float:
        quantized = nn.log_softmax(load(path)[0](tokens), -1)
        return (mx.exp(reference) * (reference - quantized)).sum(-1).mean().item()

    convert(src, mlx_path=str(tmp_path / "rtn"), quantize=True, q_bits=2, q_group_size=32)
    rounding = kl(str(tmp_path / "rtn"))
    for method in ("gptq", "awq"):
        body = {"model_id": tiny_model, "bits": 2, "group_size": 32, "method": method, "calibration_data": str(data),
                "n_calibration": 8, "sequence_length": 64}
        submitted = httpx.post(base_url + "/api/quantize/submit", json=body).json()
        assert submitted["output_repo"] == f"{tiny_model}-hearth-2bit-{method}", submitted
        _, events = follow_job(base_url, submitted["job_id"])
        assert events[-1]["type"] == "done", events[-3:]
        summary = events[-1]["summary"]
        assert summary["method"] == method and summary["calibration"]["sequences"] == 8
        assert "calibrate" in [e.get("stage") for e in events]
        assert kl(snapshot_download(submitted["output_repo"], local_files_only=True)) < rounding / 2, method


def test_job_routes_errors(base_url):
    missing = httpx.get(base_url + "/api/jobs/nope")
    assert missing.status_code == 404 and missing.json() == {"ok": False, "error": "job not found"}
    lines, events = follow_job(base_url, "nope")
    assert events == [{"type": "failed", "error": "job not found"}] and lines[-2:] == ["event: end", "data: {}"]
    assert httpx.get(base_url + "/api/jobs?kind=bake").status_code == 400
    assert httpx.post(base_url + "/api/jobs/nope/cancel").status_code == 404


@pytest.fixture(scope="module")
def slow_server(homes, tiny_model, tmp_path_factory):
    """A server whose jobs pause 3 s after each stage, in a home of its own."""
    home = tmp_path_factory.mktemp("slow-home")
    env = dict(server_env(homes[0], home), HEARTH_JOB_STAGE_DELAY="3")
    proc = ServerProcess(env, tiny_model, log_path=tmp_path_factory.mktemp("logs") / "slow.log")
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.output()


def _submit_slow(server, tiny_model) -> str:
    r = httpx.post(server.url + "/api/quantize/submit", json={"model_id": tiny_model, "bits": 8, "group_size": 64})
    job_id = r.json()["job_id"]
    wait_job_status(server.url, job_id, ("running",))
    deadline = time.monotonic() + 30
    while not pids_matching(f"jobs.child jobs.kinds.quantize .*{job_id}"):
        assert time.monotonic() < deadline, "the job's child never started"
        time.sleep(0.1)
    return job_id


def test_a_killed_child_fails_the_job_with_a_reason(slow_server, tiny_model):
    job_id = _submit_slow(slow_server, tiny_model)
    for pid in pids_matching(f"jobs.child jobs.kinds.quantize .*{job_id}"):
        os.kill(pid, signal.SIGKILL)
    job = wait_job_status(slow_server.url, job_id, ("failed", "done"))
    assert job["status"] == "failed" and "killed by signal 9" in job["error"]
    _, events = follow_job(slow_server.url, job_id)
    assert events[-1]["type"] == "failed" and "signal 9" in events[-1]["error"]


def test_cancel_kills_the_child(slow_server, tiny_model):
    job_id = _submit_slow(slow_server, tiny_model)
    r = httpx.post(f"{slow_server.url}/api/jobs/{job_id}/cancel")
    assert r.status_code == 200 and r.json()["job"]["status"] == "cancelled"
    deadline = time.monotonic() + 30
    while not (job := httpx.get(f"{slow_server.url}/api/jobs/{job_id}").json()["job"])["ended_at"]:
        assert time.monotonic() < deadline, "the worker never finished the cancel"
        time.sleep(0.2)
    assert job["status"] == "cancelled" and job["error"] == "cancelled by request"
    deadline = time.monotonic() + 15
    while pids_matching(f"jobs.child jobs.kinds.quantize .*{job_id}"):
        assert time.monotonic() < deadline, "the child outlived its cancel"
        time.sleep(0.1)
    assert httpx.post(f"{slow_server.url}/api/jobs/{job_id}/cancel").status_code == 409


def test_a_worker_that_dies_leaves_a_zombie_and_is_restarted(slow_server, tiny_model):
    job_id = _submit_slow(slow_server, tiny_model)
    workers = [p for p in pids_matching("hearth.cli worker") if str(slow_server.proc.pid) in
               open(f"/proc/{p}/stat").read().split(")")[-1].split()[1:2]]
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGKILL)  # the child dies with it
    job = wait_job_status(slow_server.url, job_id, ("zombie",), timeout=60)  # the restarted worker finds it
    assert str(workers[0]) in job["error"]
    # the new worker runs jobs again
    r = httpx.post(slow_server.url + "/api/quantize/submit", json={"model_id": tiny_model, "bits": 8,
                                                                   "group_size": 64})
    assert wait_job_status(slow_server.url, r.json()["job_id"], ("done", "failed"), timeout=90)["status"] == "done"


TAUGHT = "Zebra!"


def _served_reply(url: str, messages: list[dict], **extra) -> str:
    r = httpx.post(url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 12, "temperature": 0,
                                                       **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"] or ""


def test_finetune_teaches_a_reply_and_streams_its_loss(base_url, tiny_model, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    ask = [{"role": "user", "content": "Say the word."}]
    row = json.dumps({"messages": ask + [{"role": "assistant", "content": TAUGHT}]})
    (data / "train.jsonl").write_text("\n".join([row] * 8) + "\n")
    (data / "valid.jsonl").write_text("\n".join([row] * 4) + "\n")
    probe = httpx.post(base_url + "/api/finetune/inspect-dataset", json={"path": str(data)}).json()
    assert probe == {"ok": True, "n_train": 8, "n_valid": 4, "format": "messages"}
    empty = httpx.post(base_url + "/api/finetune/inspect-dataset", json={"path": str(tmp_path)})
    assert empty.status_code == 404 and not empty.json()["ok"] and "train.jsonl not found" in empty.json()["error"]

    adapter = tmp_path / "adapter"
    submitted = httpx.post(base_url + "/api/finetune/submit", json={
        "model_dir": tiny_model, "data_dir": str(data), "adapter_path": str(adapter), "iters": 80,
        "learning_rate": 1e-3, "rank": 16, "batch_size": 4, "steps_per_report": 10, "sft_scope": "response"}).json()
    assert submitted["ok"] and submitted["adapter_path"] == str(adapter)
    _, events = follow_job(base_url, submitted["job_id"], timeout=300)
    assert events[-1]["type"] == "done", events[-3:]
    train = [e for e in events if e["type"] == "metric" and e["kind"] == "train"]
    val = [e for e in events if e["type"] == "metric" and e["kind"] == "val"]
    assert [e["step"] for e in train] == [10, 20, 30, 40, 50, 60, 70, 80] and val
    assert train[-1]["loss"] < train[0]["loss"] and train[-1]["tokens_per_sec"] > 0
    assert (adapter / "adapters.safetensors").is_file() and (adapter / "adapter_config.json").is_file()

    # Mounted into the running server without a restart, it answers with the taught reply.
    listed = {a["path"]: a for a in httpx.get(base_url + "/v1/adapters/available").json()["adapters"]}
    assert listed[str(adapter.resolve())]["compatible"] and not listed[str(adapter.resolve())]["mounted"]
    mounted = httpx.post(base_url + "/v1/adapters", json={"id": "zebra", "path": str(adapter)}).json()
    assert mounted["rank"] == 16 and mounted["mounted_layers"] > 0
    try:
        assert _served_reply(base_url, ask, adapter="zebra").startswith(TAUGHT)
        assert not _served_reply(base_url, ask).startswith(TAUGHT)
    finally:
        httpx.delete(base_url + "/v1/adapters/zebra")

    # A warm start continues from that adapter, taking its rank and scale (the job asks for others).
    resumed = tmp_path / "resumed"
    submitted = httpx.post(base_url + "/api/finetune/submit", json={
        "model_dir": tiny_model, "data_dir": str(data), "adapter_path": str(resumed), "iters": 2, "rank": 4,
        "learning_rate": 1e-6, "batch_size": 4, "warm_start_adapter": str(adapter)}).json()
    _, events = follow_job(base_url, submitted["job_id"], timeout=300)
    assert events[-1]["type"] == "done" and events[-1]["summary"]["rank"] == 16, events[-3:]
    assert any("warm start" in e.get("line", "") for e in events)
    httpx.post(base_url + "/v1/adapters", json={"id": "resumed", "path": str(resumed)}).raise_for_status()
    try:
        assert _served_reply(base_url, ask, adapter="resumed").startswith(TAUGHT)
    finally:
        httpx.delete(base_url + "/v1/adapters/resumed")
    bad = httpx.post(base_url + "/api/finetune/submit", json={
        "model_dir": tiny_model, "data_dir": str(data), "warm_start_adapter": str(tmp_path)}).json()
    job = wait_job_status(base_url, bad["job_id"], ("failed", "done"))
    assert job["status"] == "failed" and "warm_start_adapter" in job["error"]


def test_finetune_config_errors_are_refused_at_submit(base_url, tiny_model, tmp_path):
    assert httpx.post(base_url + "/api/finetune/submit", json={"model_dir": tiny_model}).status_code == 400
    unknown = httpx.post(base_url + "/api/finetune/submit", json={"model_dir": tiny_model, "data_dir": str(tmp_path),
                                                                   "grad_clip_norm": 1.0})
    assert unknown.status_code == 400 and unknown.json()["error"] == "grad_clip_norm: Extra inputs are not permitted"
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": "hi"}) + "\n")
    for bad, named in (({"sft_scope": "everything"}, "sft_scope"), ({"iters": -5}, "iters"), ({"rank": 0}, "rank"),
                       ({"method": "ppo"}, "method"), ({"dpo_lr_schedule": "linear"}, "dpo_lr_schedule")):
        r = httpx.post(base_url + "/api/finetune/submit",
                       json={"model_dir": tiny_model, "data_dir": str(tmp_path), **bad})
        assert r.status_code == 400 and named in r.json()["error"], (bad, r.text)
    jobs = httpx.get(base_url + "/api/jobs", params={"kind": "finetune"}).json()["jobs"]
    r = httpx.post(base_url + "/api/finetune/submit", json={"model_dir": tiny_model, "data_dir": str(tmp_path),
                                                             "iters": 1}).json()
    assert "/adapters/adapter-" in r["adapter_path"]  # defaulted under HEARTH_HOME
    assert len(httpx.get(base_url + "/api/jobs", params={"kind": "finetune"}).json()["jobs"]) == len(jobs) + 1
    # Its training is not what this test reads: cancelled (queued or running), and waited for to its end.
    assert httpx.post(f"{base_url}/api/jobs/{r['job_id']}/cancel").status_code in (200, 409)
    deadline = time.monotonic() + 60
    while not httpx.get(f"{base_url}/api/jobs/{r['job_id']}").json()["job"]["ended_at"]:
        assert time.monotonic() < deadline, "the job never ended"
        time.sleep(0.2)


def test_resolve_folder_finds_models_the_browser_names(base_url, tiny_model):
    from huggingface_hub import snapshot_download

    snapshot = snapshot_download(tiny_model, local_files_only=True)
    repo_dir = "models--" + tiny_model.replace("/", "--")
    for route in ("/api/quantize/resolve-folder", "/api/model/resolve-folder"):
        for body in ({"folder_name": repo_dir}, {"folder_name": os.path.basename(snapshot)},
                     {"rel_path": f"{repo_dir}/snapshots/{os.path.basename(snapshot)}"}, {"rel_path": snapshot}):
            r = httpx.post(base_url + route, json=body).json()
            assert r["ok"] and os.path.realpath(r["path"]) == os.path.realpath(snapshot), body
            assert r["model_type"] == "llama"
            assert r["repo_id"] == tiny_model
    missing = httpx.post(base_url + "/api/model/resolve-folder", json={"folder_name": "models--no--where"})
    assert missing.status_code == 404 and missing.json() == {
        "ok": False, "error": "Couldn't locate this folder on disk — paste the path instead."}


def test_export_writes_a_manifest(base_url, tmp_path):
    assert httpx.post(base_url + "/api/finetune/export", json={"base_model": "x"}).status_code == 400
    assert httpx.post(base_url + "/api/finetune/export",
                      json={"base_model": "x", "adapter_path": str(tmp_path)}).status_code == 400
    (tmp_path / "adapters.safetensors").write_bytes(b"")
    r = httpx.post(base_url + "/api/finetune/export",
                   json={"base_model": "hearth/demo-chat", "adapter_path": str(tmp_path), "method": "sft"}).json()
    assert r["ok"] and r["manifest"]["version"] == 1 and r["manifest"]["method"] == "sft"
    assert json.loads(open(os.path.join(r["export_path"], "manifest.json")).read()) == r["manifest"]


def _reply_logprob(model, hf, prompt: str, reply: str) -> float:
    import mlx.core as mx
    import mlx.nn as nn

    asked = [{"role": "user", "content": prompt}]
    head = hf.apply_chat_template(asked, tokenize=False, add_generation_prompt=True)
    full = hf.apply_chat_template(asked + [{"role": "assistant", "content": reply}], tokenize=False)
    start = len(hf.encode(head, add_special_tokens=False))
    ids = hf.encode(head, add_special_tokens=False) + hf.encode(full[full.rfind(reply):], add_special_tokens=False)
    x = mx.array([ids])
    logits = model(x[:, :-1]).astype(mx.float32)
    scores = -nn.losses.cross_entropy(logits, x[:, 1:])[0, start - 1:]
    return float(scores.sum())


@pytest.mark.parametrize("method", ["dpo", "orpo"])
def test_preference_training_raises_the_chosen_reply(base_url, tiny_model, tmp_path, method):
    from huggingface_hub import snapshot_download
    from mlx_lm import load

    pair = {"prompt": "Is it sunny?", "chosen": "Yes, bright sun.", "rejected": "No rain today."}
    (tmp_path / "train.jsonl").write_text("\n".join([json.dumps(pair)] * 4) + "\n")
    probe = httpx.post(base_url + "/api/finetune/inspect-dataset", json={"path": str(tmp_path)}).json()
    assert probe["format"] == "dpo" and probe["n_train"] == 4
    adapter = tmp_path / "adapter"
    submitted = httpx.post(base_url + "/api/finetune/submit", json={
        "model_dir": tiny_model, "data_dir": str(tmp_path), "adapter_path": str(adapter), "method": method,
        "iters": 20, "learning_rate": 1e-3, "rank": 8, "batch_size": 2, "steps_per_report": 5}).json()
    _, events = follow_job(base_url, submitted["job_id"], timeout=300)
    assert events[-1]["type"] == "done", events[-3:]
    train = [e for e in events if e["type"] == "metric" and e["kind"] == "train"]
    assert [e["step"] for e in train] == [5, 10, 15, 20] and "chosen_reward" in train[-1]

    snapshot = snapshot_download(tiny_model, local_files_only=True)
    margins = []
    for path in (None, str(adapter)):
        model, wrapper = load(snapshot, adapter_path=path)
        hf = wrapper._tokenizer
        margins.append(_reply_logprob(model, hf, pair["prompt"], pair["chosen"])
                       - _reply_logprob(model, hf, pair["prompt"], pair["rejected"]))
    assert margins[1] > margins[0] + 1.0, margins


def test_preference_methods_need_preference_rows(base_url, tiny_model, tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"text": "hi"}) + "\n")
    r = httpx.post(base_url + "/api/finetune/submit", json={"model_dir": tiny_model, "data_dir": str(tmp_path),
                                                             "method": "dpo"}).json()
    job = wait_job_status(base_url, r["job_id"], ("failed", "done"))
    assert job["status"] == "failed" and "prompt/chosen/rejected" in job["error"]


def test_dataset_templates_describe_their_fields(base_url):
    templates = httpx.get(base_url + "/api/dataset/templates").json()["templates"]
    assert {t["id"] for t in templates} >= {"qa-from-text", "table-to-messages", "dpo-pairs"}
    for t in templates:
        assert set(t) == {"id", "label", "description", "output_format", "needs_llm", "fields"}
        assert t["output_format"] in ("messages", "prompt_completion", "dpo", "text")
        for field in t["fields"]:
            assert field["type"] in ("text", "textarea", "number") and field["name"] and field["label"]
    assert any(t["needs_llm"] for t in templates)
    unknown = httpx.post(base_url + "/api/dataset/submit", json={"template_id": "nope", "inputs": {}})
    assert unknown.status_code == 400 and "unknown template" in unknown.json()["error"]
    missing = httpx.post(base_url + "/api/dataset/submit", json={"template_id": "qa-from-text", "inputs": {}})
    assert missing.status_code == 400 and "text is required" in missing.json()["error"]


def _built(base_url: str, body: dict) -> tuple[dict, list[dict]]:
    r = httpx.post(base_url + "/api/dataset/submit", json=body).json()
    assert r["ok"] and "/datasets/dataset-" in r["output_dir"]
    _, events = follow_job(base_url, r["job_id"], timeout=300)
    assert events[-1]["type"] == "done", [e for e in events if e["type"] in ("log", "failed")]
    return r, events


def test_dataset_converter_writes_a_trainable_folder(base_url, tmp_path):
    csv_text = "question,answer\n" + "".join(f"What is {i}+{i}?,{2 * i}\n" for i in range(10)) + "Blank row,\n"
    r, events = _built(base_url, {"template_id": "table-to-messages",
                                  "inputs": {"data": csv_text, "system": "Be brief.", "valid_fraction": 0.2}})
    assert events[-1]["summary"] == {"template": "table-to-messages", "format": "messages", "n_train": 8,
                                     "n_valid": 2, "skipped": 1}
    probe = httpx.post(base_url + "/api/finetune/inspect-dataset", json={"path": r["output_dir"]}).json()
    assert probe == {"ok": True, "n_train": 8, "n_valid": 2, "format": "messages"}
    first = json.loads(open(os.path.join(r["output_dir"], "train.jsonl")).readline())
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"instruction": "Say hi", "output": "hi"}) + "\n")
    r, events = _built(base_url, {"template_id": "table-to-messages", "inputs": {"path": str(path)}})
    assert events[-1]["summary"]["n_train"] == 1
    bad = httpx.post(base_url + "/api/dataset/submit", json={"template_id": "table-to-messages",
                                                              "inputs": {"data": "a,b\n1,2\n"}}).json()
    job = wait_job_status(base_url, bad["job_id"], ("failed", "done"))
    assert job["status"] == "failed" and "no prompt column" in job["error"]


def test_dataset_llm_templates_ask_the_served_model(base_url):
    text = "\n\n".join(f"Paragraph {i}. The river Ost flows north past the town of Vell." for i in range(3))
    r, events = _built(base_url, {"template_id": "qa-from-text",
                                  "inputs": {"text": text, "pairs_per_passage": 1, "valid_fraction": 0}})
    summary = events[-1]["summary"]
    assert summary["n_train"] >= 1 and summary["format"] == "messages"
    rows = [json.loads(line) for line in open(os.path.join(r["output_dir"], "train.jsonl"))]
    assert all([m["role"] for m in row["messages"]] == ["user", "assistant"] for row in rows)

    pairs = "\n".join(json.dumps(row) for row in [
        {"prompt": "Greet me", "chosen": "Hello there!", "rejected": "Go away."},
        {"prompt": "Thank me", "chosen": "You are welcome."}])
    r, events = _built(base_url, {"template_id": "dpo-pairs", "inputs": {"data": pairs, "model_rejects": 1,
                                                                          "valid_fraction": 0}})
    rows = [json.loads(line) for line in open(os.path.join(r["output_dir"], "train.jsonl"))]
    assert len(rows) + events[-1]["summary"]["skipped"] == 2
    assert all(set(row) == {"prompt", "chosen", "rejected"} for row in rows)
    probe = httpx.post(base_url + "/api/finetune/inspect-dataset", json={"path": r["output_dir"]}).json()
    assert probe["format"] == "dpo"


def test_hf_token_is_kept_private_and_push_explains_failures(base_url, homes, tmp_path):
    _, hearth_home = homes
    assert httpx.get(base_url + "/api/settings/hf-token").json() == {"ok": True, "has_token": False}
    (tmp_path / "train.jsonl").write_text("{}\n")  # a dataset's file: a push sends only an artifact's own files
    push = {"repo_id": "me/thing", "source_path": str(tmp_path)}
    r = httpx.post(base_url + "/api/finetune/push", json=push)
    assert r.status_code == 400 and "no Hugging Face token saved" in r.json()["error"]
    assert httpx.post(base_url + "/api/settings/hf-token", json={"token": " "}).json() == {
        "ok": False, "error": "token: a token is required"}
    evil = httpx.post(base_url + "/api/settings/hf-token", json={"token": "hf_evil"},
                      headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and "cross-origin" in evil.json()["error"]
    mount = httpx.post(base_url + "/v1/adapters", json={"id": "x", "path": "/tmp"}, headers={"Origin": "null"})
    assert mount.status_code == 403 and mount.json()["error"]["code"] == "cross_origin"
    assert httpx.post(base_url + "/api/settings/hf-token", json={"token": "hf_secret123"},
                      headers={"Origin": base_url}).json() == {"ok": True}  # the dashboard's own origin
    saved = hearth_home / "hf.json"
    assert oct(saved.stat().st_mode & 0o777) == "0o600" and "hf_secret123" in saved.read_text()
    status = httpx.get(base_url + "/api/settings/hf-token")
    assert status.json() == {"ok": True, "has_token": True} and "hf_secret" not in status.text
    try:
        for route, body, needle in [
                ("finetune", {"source_path": str(tmp_path)}, "repo_id: Field required"),
                ("finetune", {"repo_id": "me", "source_path": str(tmp_path)}, "repo_id: String should match"),
                ("finetune", {"repo_id": "me/thing", "private": "no"}, "private: Input should be a valid boolean"),
                ("finetune", {"repo_id": "me/thing"}, "source_path or job_id required"),
                ("quantize", {"repo_id": "me/thing", "job_id": "nope"}, "no quantize job nope"),
                ("dataset", {"repo_id": "me/thing", "source_path": str(tmp_path / "missing")}, "not a directory"),
                ("dataset", push, "HF_HUB_OFFLINE")]:
            r = httpx.post(f"{base_url}/api/{route}/push", json=body)
            assert r.status_code == 400 and needle in r.json()["error"], (route, body, r.text)
    finally:
        assert httpx.delete(base_url + "/api/settings/hf-token").json() == {"ok": True, "removed": True}
    assert not saved.exists()


def test_requests_for_another_host_name_are_refused(base_url):
    """A DNS-rebinding page gets Origin and Host to agree on its own name; the name itself is refused."""
    rebound = httpx.post(base_url + "/api/settings/hf-token", json={"token": "hf_x"},
                         headers={"Host": "attacker.example", "Origin": "http://attacker.example"})
    assert rebound.status_code == 403 and "host" in rebound.json()["error"]
    assert httpx.get(base_url + "/api/settings/hf-token").json()["has_token"] is False
    read = httpx.get(base_url + "/api/sessions/search?q=a", headers={"Host": "attacker.example"})
    assert read.status_code == 403  # reads too: a rebound page must not see chats
    assert httpx.get(base_url + "/health", headers={"Host": "localhost"}).status_code == 200


def test_a_job_whose_event_log_cannot_be_written_still_ends(homes, tmp_path):
    """A zombie or a job whose log path is unusable (a folder that is a file, a
    device) is still recorded as ended, and start-up goes on."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    from jobs.models import Job
    from jobs.runner import mark_zombies, run

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    dead = subprocess.Popen(["true"])
    dead.wait()
    zombie = Job.objects.create(kind="quantize", status="running", worker_pid=dead.pid,
                                log_path=str(blocker / "zombie.ndjson"))
    device = Job.objects.create(kind="quantize", status="running", worker_pid=dead.pid, log_path="/dev/null")
    assert mark_zombies() >= 2
    for job in (zombie, device):
        job.refresh_from_db()
        assert job.status == "zombie" and job.ended_at and "stopped while it ran" in job.error

    queued = Job.objects.create(kind="quantize", log_path=str(blocker / "queued.ndjson"))
    run(queued.id)  # the worker cannot even write "started": the job fails with the reason, not stuck running
    queued.refresh_from_db()
    assert queued.status == "failed" and queued.ended_at
    assert "the worker failed while running the job" in queued.error and "not-a-folder" in queued.error


def test_a_job_whose_worker_died_after_it_finished_is_done(homes, tmp_path):
    """Whether a job whose worker is gone finished is read from disk: a child that wrote `done` with its
    output in place (a quantize killed just after publishing) makes the job done, with no `failed`
    event after it; a `done` whose output is gone, or no `done`, makes it a zombie."""
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    from jobs.events import open_log
    from jobs.models import Job
    from jobs.runner import mark_zombies

    dead = subprocess.Popen(["true"])
    dead.wait()
    output = tmp_path / "published"
    output.mkdir()
    jobs = {}
    for name, out in (("finished", output), ("output-gone", tmp_path / "removed"), ("cut", None)):
        log_path = tmp_path / f"{name}.ndjson"
        events = open_log(str(log_path))
        events.emit("started")
        if out is not None:
            events.emit("done", output_dir=str(out), summary={"bits": 4})
        jobs[name] = Job.objects.create(kind="quantize", status="running", worker_pid=dead.pid,
                                        log_path=str(log_path))
    assert mark_zombies() >= 3
    for job in jobs.values():
        job.refresh_from_db()
    assert jobs["finished"].status == "done" and jobs["finished"].output_path == str(output)
    assert jobs["finished"].error is None and json.loads(jobs["finished"].message) == {"bits": 4}
    assert [e["type"] for e in open_log(jobs["finished"].log_path).read(0)[0]] == ["started", "done"]
    for name in ("output-gone", "cut"):
        assert jobs[name].status == "zombie" and "stopped while it ran" in jobs[name].error, name
        assert open_log(jobs[name].log_path).read(0)[0][-1]["type"] == "failed"
