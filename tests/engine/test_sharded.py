"""A model sharded across two processes on loopback (`mlx.launch --backend
ring -n 2`, mx.distributed): `hearth generate-sharded` gives, token for
token, the greedy output of one process holding the whole model (this one,
loading it as `hearth serve` does), both tensor-parallel (the tiny llama)
and pipeline-parallel (a tiny qwen2, saved in the indexed layout pipeline
loading reads). The chosen tokens' log-probabilities agree too, so the
sharded forward computes the same function, not merely the same argmax."""
from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inference.engine import loader, sharded
from inference.engine.errors import ModelNotFound
from tests.helpers import HEARTH, ROOT, TINY_REPO, server_env

LAUNCH = str(Path(sys.executable).with_name("mlx.launch"))
PROMPT = "Tell me about the sea"
MAX_TOKENS = 24


@pytest.fixture(scope="module", autouse=True)
def ring_backend():
    import mlx.core as mx

    if not mx.distributed.is_available("ring"):
        pytest.skip("this MLX build has no ring backend")


def free_port_pair() -> int:
    """A port p with p and p+1 both free on loopback (mlx.launch gives rank r port p+r)."""
    for _ in range(200):
        port = random.randint(20000, 60000)
        socks = []
        try:
            for p in (port, port + 1):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no two consecutive free ports on loopback")


def answer(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, stdout  # rank 0 alone prints
    return json.loads(lines[0])


def launched(env: dict, model: str, *extra: str) -> dict:
    """`hearth generate-sharded` on two ranks; rank 0's JSON answer."""
    command = [LAUNCH, "--backend", "ring", "-n", "2", "--starting-port", str(free_port_pair()), "--",
               *HEARTH, "generate-sharded", model, "--prompt", PROMPT, "--raw", "--max-tokens", str(MAX_TOKENS),
               "--json", *extra]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return answer(done.stdout)


def alone(model: str) -> sharded.Greedy:
    """The reference: the whole model in this one process, loaded as `hearth serve` loads it."""
    loaded = loader.load(model)
    return sharded.greedy(loaded, list(loaded.tokenizer.encode(PROMPT)), MAX_TOKENS)


def assert_same(shared: dict, reference: sharded.Greedy) -> None:
    assert len(set(reference.tokens)) >= 2, reference.tokens  # a real comparison, not one token repeated
    assert shared["prompt_tokens"] == reference.prompt_tokens
    assert shared["tokens"] == reference.tokens
    assert shared["text"] == reference.text
    assert shared["logprobs"] == pytest.approx(reference.logprobs, abs=1e-4)


@pytest.fixture(scope="module")
def env(homes, tiny_model):
    return dict(server_env(*homes), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


def test_two_tensor_ranks_generate_what_one_process_does(env):
    shared = launched(env, TINY_REPO)
    assert (shared["ranks"], shared["mode"], shared["model"]) == (2, "tensor", TINY_REPO)
    assert_same(shared, alone(TINY_REPO))


def tiny_qwen2(homes, out: Path) -> Path:
    """A random 2-layer qwen2 (a model with pipeline support) beside the tiny
    llama's tokenizer, its weights in the `model.safetensors.index.json` layout."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.qwen2 import Model, ModelArgs

    snapshot = next((homes[0] / "hub" / ("models--" + TINY_REPO.replace("/", "--")) / "snapshots").iterdir())
    base = json.loads((snapshot / "config.json").read_text())
    config = {**base, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}
    out.mkdir()
    mx.random.seed(11)
    weights = dict(tree_flatten(Model(ModelArgs.from_dict(config)).parameters()))
    name = "model-00001-of-00001.safetensors"
    mx.save_safetensors(str(out / name), weights, metadata={"format": "mlx"})
    index = {"metadata": {"total_size": sum(v.nbytes for v in weights.values())},
             "weight_map": {key: name for key in weights}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    (out / "config.json").write_text(json.dumps(config))
    for f in snapshot.iterdir():
        if f.name != "config.json" and not f.name.endswith(".safetensors"):
            (out / f.name).write_bytes(f.read_bytes())
    return out


def test_two_pipeline_ranks_generate_what_one_process_does(env, homes, tmp_path):
    model = str(tiny_qwen2(homes, tmp_path / "tiny-qwen2"))
    shared = launched(env, model, "--pipeline")
    assert (shared["ranks"], shared["mode"]) == (2, "pipeline")
    assert_same(shared, alone(model))


class TwoRanks:
    """Rank 0 of a group of two, for the checks made before any rank talks to another."""

    def size(self) -> int:
        return 2

    def rank(self) -> int:
        return 0


def test_what_cannot_be_sharded_is_refused_before_loading(tiny_model):
    group: Any = TwoRanks()
    with pytest.raises(sharded.DistributedError, match="model.safetensors.index.json"):
        sharded.load_sharded(tiny_model, group, pipeline=True)
    with pytest.raises(ModelNotFound):
        sharded.load_sharded("nobody/nothing", group)
    with pytest.raises(sharded.DistributedError, match="backend must be one of"):
        sharded.join_group("carrier-pigeon")


def test_a_single_process_is_a_group_of_one():
    group = sharded.join_group()
    assert group.size() == 1
    assert sharded.share_ids(group, [3, 1, 4]) == [3, 1, 4]
