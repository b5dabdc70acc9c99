"""Job kinds as they are registered: each with its run module and its
submit schema; the fine-tune body built from the trainer's own settings
(one list of names and defaults); and the job's child process, which runs
the module it is named."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT


@pytest.fixture(scope="module")
def registry():
    import django

    django.setup()
    from jobs import registry

    return registry


def test_every_kind_registers_its_run_module_and_submit_schema(registry):
    from pydantic import BaseModel

    assert set(registry.names()) >= {"quantize", "finetune", "dataset", "synthesis"}
    for name in registry.names():
        kind = registry.get(name)
        assert isinstance(kind.run_module, str) and kind.run_module, name
        assert issubclass(kind.schema, BaseModel), name
        assert kind.schema.model_json_schema()["properties"], name


def test_the_fine_tune_body_lists_every_setting_the_trainer_defaults(registry):
    from jobs.kinds import finetune

    schema = registry.get("finetune").schema.model_json_schema()
    props = schema["properties"]
    assert set(props) == {"model_dir", "data_dir", "adapter_path", *finetune.DEFAULTS}
    assert sorted(schema["required"]) == ["data_dir", "model_dir"]
    assert {key: props[key]["default"] for key in finetune.DEFAULTS} == finetune.DEFAULTS
    assert props["save_checkpoints"]["type"] == "boolean" and props["learning_rate"]["type"] == "number"
    assert props["target_modules"]["anyOf"][0] == {"items": {"type": "string"}, "type": "array"}
    assert schema.get("additionalProperties") is False  # a setting the trainer does not have is refused by name
    assert finetune.settings({}) == finetune.DEFAULTS
    assert set(props) == {*finetune.PATHS, *finetune.DEFAULTS}  # the trainer's own list of the body's paths
    for key, why in (("rs_lora", "not offered by this trainer"), ("learning_rat", "not a fine-tune setting")):
        with pytest.raises(ValueError, match=f"^{key}: {why}"):  # a job's config is held to the same list
            finetune.settings({"data_dir": "d", key: True})


def test_the_submit_routes_take_their_kinds_schema(registry):
    """The body a submit route validates is the one its job kind registers: same fields, same required ones."""
    from hearth.api import api

    doc = api.get_openapi_schema(path_prefix="/api")
    components = doc["components"]["schemas"]
    for path, kind in (("/api/finetune/submit", "finetune"), ("/api/quantize/submit", "quantize")):
        ref = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        body = components[ref.rsplit("/", 1)[1]]
        registered = registry.get(kind).schema.model_json_schema()
        assert set(body["properties"]) == set(registered["properties"]), path
        assert body.get("required") == registered.get("required"), path
        assert body.get("additionalProperties") is False, path  # an option it does not list is refused


def test_the_child_runs_the_module_it_is_named(tmp_path):
    (tmp_path / "hearth_probe_kind.py").write_text(textwrap.dedent("""
        def run(config, log, stage_delay):
            log.emit("stage", stage="work", progress=0.5, message=config["say"])
            return "/nowhere", {"said": config["say"]}
    """))
    log = tmp_path / "job.ndjson"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    config = tmp_path / "job.config.json"
    config.write_text(json.dumps({"say": "hello"}))
    done = subprocess.run([sys.executable, "-m", "jobs.child", "hearth_probe_kind", str(log), str(config)],
                          cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["type"] for e in events] == ["stage", "done"]
    assert events[-1]["output_dir"] == "/nowhere" and events[-1]["summary"] == {"said": "hello"}


def _folder(root, name: str, train: list, valid: list | None = None):
    folder = root / name
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in train))
    if valid is not None:
        (folder / "valid.jsonl").write_text("".join(json.dumps(row) + "\n" for row in valid))
    return folder


def test_a_dataset_the_trainer_cannot_read_is_refused_naming_the_file_and_row(tiny_model, tmp_path):
    """Checked before a model loads (inspect-dataset answers it as a 422, the job as its error): rows
    with other columns, no rows, a later row in another format than the first, a valid.jsonl in
    another format than train.jsonl."""
    from jobs.kinds import finetune

    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    cases = [
        (_folder(tmp_path, "columns", [{"question": "q", "answer": "a"}]), "train.jsonl row 1 has answer, question: "
         "rows must be messages, prompt/completion or text"),
        (_folder(tmp_path, "empty", []), "train.jsonl has no rows"),
        (_folder(tmp_path, "mixed", [{"text": "one"}, {"prompt": "a", "completion": "b"}]),
         "train.jsonl row 2 has no usable 'text': every row must be text like row 1"),
        (_folder(tmp_path, "blank", [{"text": "one"}, {"text": ""}]), "train.jsonl row 2 has no usable 'text'"),
        (_folder(tmp_path, "halves", [{"prompt": "a", "completion": "b"}, {"prompt": "c"}]),
         "train.jsonl row 2 has no usable 'completion'"),
        (_folder(tmp_path, "valid", [chat], [{"text": "one"}]),
         "valid.jsonl rows are text, train.jsonl's chat messages: both files need the same format"),
    ]
    for folder, message in cases:
        with pytest.raises(ValueError, match="^" + re.escape(message)):
            finetune.inspect(str(folder))
    with pytest.raises(ValueError, match="^" + re.escape(cases[2][1])):  # the job fails with the same words
        finetune.run({"model_dir": tiny_model, "data_dir": str(cases[2][0]), "adapter_path": str(tmp_path / "a")},
                     _NoLog())
    good = _folder(tmp_path, "good", [chat, chat], [chat])
    assert finetune.inspect(str(good)) == {"ok": True, "n_train": 2, "n_valid": 1, "format": "messages"}


class _NoLog:
    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def emit(self, event: str, /, **fields) -> None:
        self.events.append((event, fields))


def test_rows_cut_off_before_their_reply_are_left_out_not_trained_into_nan(tiny_model, tmp_path):
    """mlx-lm divides the loss by the tokens trained; a batch of replies all past max_seq_length has
    none, and its NaN would end up in every weight of the adapter while the job reports done."""
    import mlx.core as mx

    from jobs.kinds import finetune

    long_prompt = "The quick brown fox jumps over the lazy dog. " * 6
    rows = [{"prompt": long_prompt, "completion": "no room left"}] * 6 + [{"prompt": "Hi", "completion": "Hello"}] * 2
    data = _folder(tmp_path, "data", rows)
    config = {"model_dir": tiny_model, "data_dir": str(data), "iters": 4, "sft_scope": "response",
              "max_seq_length": 48, "learning_rate": 1e-3}
    log = _NoLog()
    adapter, summary = finetune.run({**config, "adapter_path": str(tmp_path / "a")}, log)
    lines = [f["line"] for event, f in log.events if event == "log"]
    assert "6 of 8 train.jsonl rows have no reply within max_seq_length 48: they are left out" in lines, lines
    losses = [f["loss"] for event, f in log.events if event == "metric"]
    assert losses and all(loss == loss for loss in losses), losses  # no NaN
    weights = mx.load(str(tmp_path / "a" / "adapters.safetensors"))
    assert all(bool(mx.isfinite(w).all()) for w in weights.values())

    with pytest.raises(ValueError, match="^only 2 train.jsonl rows have a reply token within max_seq_length 48, "
                                         r"fewer than batch_size 4: raise max_seq_length or train on the whole "
                                         r"example \(sft_scope full\)"):
        finetune.run({**config, "batch_size": 4, "adapter_path": str(tmp_path / "b")}, _NoLog())
    with pytest.raises(ValueError, match="^max_seq_length must be at least 2"):
        finetune.run({**config, "max_seq_length": 1, "adapter_path": str(tmp_path / "c")}, _NoLog())


def test_a_failed_job_says_why_in_words():
    """The kinds' own errors are sentences for the Jobs page; anything else keeps its type's name."""
    from core.paths import PathRefused
    from inference.engine.errors import ModelNotFound
    from jobs.child import reason

    assert reason(ValueError("iters must be a positive integer")) == "iters must be a positive integer"
    assert reason(PathRefused("data_dir: x is not a file")) == "data_dir: x is not a file"
    assert reason(ModelNotFound("model 'a/b' is neither a directory")) == "model 'a/b' is neither a directory"
    assert reason(KeyError("text")) == "KeyError: 'text'"
    assert reason(ValueError()) == "ValueError: "


def test_a_worker_that_exits_as_the_server_stops_is_not_started_again(monkeypatch, caplog):
    """A terminal's Ctrl-C reaches the worker too, which exits before the server
    stops it: no "restarting" warning, no new worker. One that exits while the
    server serves is started again."""
    import logging
    import subprocess
    import sys
    import time

    from jobs import supervisor as sup

    for stopping, restarted in ((True, False), (False, True)):
        spawned: list[subprocess.Popen] = []

        def spawn(self, spawned=spawned):
            spawned.append(subprocess.Popen([sys.executable, "-c", "pass"]))
            return spawned[-1]

        monkeypatch.setattr(sup.WorkerSupervisor, "_spawn", spawn)
        monkeypatch.setattr(sup, "RESTART_DELAY_S", 0.2)
        supervisor = sup.WorkerSupervisor(server_stopping=lambda stopping=stopping: stopping)
        with caplog.at_level(logging.WARNING, logger="hearth.jobs"):
            caplog.clear()
            supervisor.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (len(spawned) < 2 if restarted else supervisor._thread.is_alive()):
                time.sleep(0.05)
            supervisor.stop()
        assert (len(spawned) >= 2) is restarted and (supervisor.restarts > 0) is restarted, stopping
        assert any("restarting" in r.getMessage() for r in caplog.records) is restarted, stopping


@pytest.mark.parametrize("method", ["dpo", "orpo"])
def test_preference_rows_with_nothing_to_compare_are_left_out_and_too_few_fail(tiny_model, tmp_path, method):
    """DPO and ORPO rows whose replies are empty or the same teach nothing, and a reply past
    max_seq_length divides its batch's scores by zero tokens: such rows are counted and left out,
    and a file left with less than a batch fails the job naming it and the counts."""
    from jobs.kinds import finetune

    pair = {"prompt": "Is it sunny?", "chosen": "Yes, bright sun.", "rejected": "No rain today."}
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 6
    rows = [pair, pair, {**pair, "chosen": " "}, {**pair, "rejected": pair["chosen"]}] + \
        [{**pair, "prompt": long_prompt}] * 3
    data = _folder(tmp_path, "data", rows, [pair, {**pair, "rejected": ""}])
    config = {"model_dir": tiny_model, "data_dir": str(data), "method": method, "iters": 2, "batch_size": 2,
              "max_seq_length": 48, "learning_rate": 1e-4}
    log = _NoLog()
    finetune.run({**config, "adapter_path": str(tmp_path / "a")}, log)
    lines = [f["line"] for event, f in log.events if event == "log"]
    why = ("1 with an empty chosen or rejected reply, 1 whose chosen and rejected replies are the same, 3 with no "
           "chosen or rejected reply token within max_seq_length 48")
    assert f"5 of 7 train.jsonl rows are left out: {why}" in lines, lines
    assert "valid.jsonl has 1 usable rows, fewer than batch_size 2: validation is skipped" in lines, lines
    losses = [f["loss"] for event, f in log.events if event == "metric"]
    assert losses and all(loss == loss for loss in losses), losses

    with pytest.raises(ValueError, match="^" + re.escape(f"only 2 of 7 train.jsonl rows are usable, fewer than "
                                                         f"batch_size 4 ({why}); raise max_seq_length")):
        finetune.run({**config, "batch_size": 4, "adapter_path": str(tmp_path / "b")}, _NoLog())


def test_a_loss_that_is_not_a_number_fails_the_job(tiny_model, tmp_path):
    """An adapter trained into NaN is never reported done."""
    from jobs.kinds import finetune

    pair = {"prompt": "Is it sunny?", "chosen": "Yes, bright sun.", "rejected": "No rain today."}
    data = _folder(tmp_path, "data", [pair] * 2)
    with pytest.raises(ValueError, match=r"^the training loss became nan at step \d+: "):
        finetune.run({"model_dir": tiny_model, "data_dir": str(data), "method": "dpo", "iters": 6, "batch_size": 2,
                      "learning_rate": 1e38, "adapter_path": str(tmp_path / "a")}, _NoLog())
