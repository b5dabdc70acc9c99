"""Building tiny models and running real `hearth serve` processes for tests."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
# Screenshots the browser tests save, for a person to look at (ignored by git).
ARTIFACTS = Path(__file__).parent / "artifacts" / "screenshots"
HEARTH = [sys.executable, "-m", "hearth.cli"]
TINY_REPO = "hearth-test/tiny-random"

# Renders a chat_template_kwargs value, and any reasoning_content in the
# history, into the prompt, so a test can see them arrive.
TEMPLATE_PROBE = ("{% if probe is defined %}{{ probe }}{% endif %}"
                  "{% for m in messages %}{% if m.reasoning_content %}{{ m.reasoning_content }}{% endif %}"
                  "{% endfor %}")

TINY_CORPUS = [
    "Hello there! How are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "List: 1. apple 2. banana 3. cherry. JSON: {\"name\": \"Ana\", \"age\": 31}",
    "héllo wörld — ünïcode ✓ 日本語 emoji 🙂",
]


def build_tiny_model(cache_dir: Path, repo_id: str = TINY_REPO, dtype: str = "float32",
                     quantize: bool = False, heads: int = 4) -> Path:
    """A random 2-layer llama with a byte-level BPE tokenizer and a chat
    template, published into `cache_dir` like a download."""
    import tempfile

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    from hub.publish import publish_to_cache
    from serving.demo.files import (
        CHAT_TEMPLATE,
        IM_END,
        llama_config,
        train_tokenizer,
        write_model_dir,
    )

    # No single-token markup: a random model would open <think> by chance.
    tok = train_tokenizer(TINY_CORPUS * 4, vocab_size=320, markup=False)
    config = llama_config(tok.get_vocab_size(), 64, 2, heads, 128, 2048, tok.token_to_id(IM_END))
    mx.random.seed(7)
    model = Model(ModelArgs.from_dict(config))
    if quantize:
        import mlx.nn as nn

        nn.quantize(model, group_size=32, bits=4)
        config["quantization"] = {"group_size": 32, "bits": 4}
    weights = {k: v.astype(getattr(mx, dtype)) if v.dtype in (mx.float32,) else v
               for k, v in tree_flatten(model.parameters())}
    config["torch_dtype"] = dtype
    with tempfile.TemporaryDirectory() as work:
        generation = {"eos_token_id": config["eos_token_id"], "temperature": 0.0, "top_k": 5}
        write_model_dir(Path(work), weights, config, tok, generation, CHAT_TEMPLATE + TEMPLATE_PROBE)
        return publish_to_cache(Path(work), repo_id, cache_dir)


HARMONY_REPO = "hearth-test/tiny-harmony"


def build_harmony_model(cache_dir: Path, repo_id: str = HARMONY_REPO) -> Path:
    """A random 2-layer gpt_oss (mlx-lm's, 4 experts) with a byte-level BPE
    tokenizer that has harmony's tokens as special tokens and stops on
    `<|return|>` and `<|call|>`, as gpt-oss does; no chat template (Hearth
    writes harmony itself)."""
    import tempfile

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.gpt_oss import Model, ModelArgs
    from tokenizers import AddedToken

    from hub.publish import publish_to_cache
    from inference.protocols import harmony
    from serving.demo.files import train_tokenizer, write_model_dir

    words = "analysis commentary final functions assistant user system developer json to=functions.get_weather"
    tok = train_tokenizer(TINY_CORPUS * 4 + [words], vocab_size=360, markup=False)
    tok.add_special_tokens([AddedToken(t, special=True) for t in harmony.TOKENS])
    stops = [tok.token_to_id(harmony.RETURN), tok.token_to_id(harmony.CALL)]
    config = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "num_hidden_layers": 2,
              "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": tok.get_vocab_size(),
              "hidden_size": 64, "intermediate_size": 64, "head_dim": 16, "num_attention_heads": 4,
              "num_key_value_heads": 2, "sliding_window": 128, "rope_theta": 150000,
              "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 4096,
              "eos_token_id": stops, "tie_word_embeddings": False}
    mx.random.seed(11)
    weights = dict(tree_flatten(Model(ModelArgs.from_dict(config)).parameters()))
    with tempfile.TemporaryDirectory() as work:
        write_model_dir(Path(work), weights, config, tok, {"eos_token_id": stops}, chat_template="")
        return publish_to_cache(Path(work), repo_id, cache_dir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`hearth serve` as a child process on a free loopback port, its replies
    capped at TURN_TOKENS unless the flags say `--max-tokens` themselves or
    `capped` is false (the trained demo models answer as they would for a user)."""

    def __init__(self, env: dict, *args: str, log_path: Path, capped: bool = True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        cap = ["--max-tokens", str(TURN_TOKENS)] if capped and "--max-tokens" not in args else []
        self.proc = subprocess.Popen([*HEARTH, "serve", *args, *cap, "--port", str(self.port)], cwd=ROOT,
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.output()}")

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def sse_events(url: str, timeout: float = 120):
    """The (event name, JSON data) pairs of a Server-sent events stream, as
    they arrive; the stream closes when the caller stops iterating."""
    import json

    with httpx.stream("GET", url, timeout=timeout) as r:
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                yield kind, json.loads(line[6:])


def server_env(hf_home: Path, hearth_home: Path) -> dict:
    env = dict(os.environ)
    env.update(HF_HOME=str(hf_home), HEARTH_HOME=str(hearth_home), HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    env.pop("HF_HUB_CACHE", None)
    return env


def newline_and_eos(tokenizer) -> list[int]:
    """The tokens XTC leaves alone, as mlx_lm.server picks them."""
    return list(tokenizer.encode("\n", add_special_tokens=False)) + sorted(tokenizer.eos_token_ids)


async def collect(engine, request, abort_after: int | None = None) -> dict:
    """Run `request` on an in-process engine: its tokens, text, logprobs
    entries, finish reason and usage (leaving after `abort_after` tokens
    aborts it, as a dropped client does)."""
    tokens, text, logprobs, final = [], "", [], None
    async for event in engine.submit(request).events():
        assert event.error is None, event.error
        tokens += event.token_ids
        text += event.text
        if event.logprobs is not None:
            logprobs.append(event.logprobs)
        if event.finish_reason is not None:
            final = event
        if abort_after is not None and len(tokens) >= abort_after:
            break
    return {"tokens": tokens, "text": text, "logprobs": logprobs,
            "finish": final.finish_reason if final else None, "usage": final.usage if final else None}


# -- jobs, adapters and leftover processes, shared by the tests of several folders ----------------------
# The reply cap of the suite's servers and chat engine when a request or session names none, as
# `hearth serve --max-tokens` sets it: the random model seldom stops by itself, and a turn of the whole
# context is seconds of decoding that no test reads. A test that needs a long reply asks for one.
TURN_TOKENS = 160
STRAY_WINDOW_S = 5.0  # how soon a worker or job child must be gone once its parent is


def follow_job(url: str, job_id: str, timeout: float = 120) -> tuple[list[str], list[dict]]:
    """A job's event stream read to its end: the raw lines and the events' data."""
    lines, events = [], []
    with httpx.stream("GET", f"{url}/api/jobs/{job_id}/stream", timeout=timeout) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            lines.append(line)
            if line.startswith("data:") and lines[-2:-1] != ["event: end"]:
                events.append(json.loads(line[5:]))
    return lines, events


def wait_job_status(url: str, job_id: str, statuses: tuple, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/api/jobs/{job_id}").json()["job"]
        if job["status"] in statuses:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {statuses}: {job}")


def write_adapter(folder: Path, tensors: dict, scale: float, base_model: str | None, layers: int = 2) -> Path:
    """A LoRA adapter folder as mlx-lm's tuner writes one."""
    import mlx.core as mx

    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "adapters.safetensors"), tensors)
    rank = next(v.shape[1] for k, v in tensors.items() if k.endswith("lora_a"))
    config = {"fine_tune_type": "lora", "num_layers": layers,
              "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0}}
    if base_model:
        config["base_model"] = base_model
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def random_adapter(snapshot: str, layers: int, seed: int) -> dict:
    """Random LoRA weights for the model at `snapshot`, from a seed."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model, _ = load(snapshot)
    model.freeze()
    linear_to_lora_layers(model, layers, {"rank": 4, "scale": 1.0, "dropout": 0.0})
    mx.random.seed(seed)
    return {k: mx.random.normal(v.shape) * 0.3 for k, v in tree_flatten(model.trainable_parameters())}


def own_processes(home: Path) -> list[psutil.Process]:
    """Job workers and job children working on HEARTH_HOME `home`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        command = " ".join(proc.info["cmdline"] or [])
        if ("hearth.cli worker" in command or "jobs.child" in command) and \
                (proc.info["environ"] or {}).get("HEARTH_HOME") == str(home):
            found.append(proc)
    return found


def children_running(pid: int, module: str) -> set[psutil.Process]:
    """The descendants of process `pid` that run `python -m module`."""
    found = set()
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            if module in " ".join(proc.cmdline()):
                found.add(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def exited(proc: psutil.Process) -> bool:
    """Gone, or exited and waiting to be reaped by whoever adopted it."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_no_strays(home: Path, within: float = STRAY_WINDOW_S) -> float:
    """Every worker and job child of `home` is gone within `within` s; how long it took."""
    started = time.monotonic()
    while left := [p for p in own_processes(home) if not exited(p)]:
        assert time.monotonic() - started < within, [" ".join(p.cmdline()) for p in left]
        time.sleep(0.05)
    return time.monotonic() - started
