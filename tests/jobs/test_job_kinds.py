"""Job kinds as they are registered: each with its run module and its
submit schema; the fine-tune body built from the trainer's own settings
(one list of names and defaults); and the job's child process, which runs
the module it is named."""
from __future__ import annotations

import json
import os
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
    done = subprocess.run([sys.executable, "-m", "jobs.child", "hearth_probe_kind", str(log),
                           json.dumps({"say": "hello"})], cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["type"] for e in events] == ["stage", "done"]
    assert events[-1]["output_dir"] == "/nowhere" and events[-1]["summary"] == {"said": "hello"}
