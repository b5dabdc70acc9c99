"""LoRA hot-swap through the app: `--adapter` as the default, mounting and
unmounting over /v1/adapters, per-request `adapter` ("none", "a+b")
checked token for token against mlx-lm loading the same adapter, shape
checks that mount nothing, prompt-cache namespaces and mixed-adapter
batches."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import random_adapter, write_adapter

PROMPT = "the cat sat on the"


def _stacked(first: dict, second: dict, scales: tuple[float, float]) -> dict:
    """One adapter equal to two stacked: concatenate along the rank (zeros
    where a source has no such layer), scales folded into b."""
    import mlx.core as mx

    out = {}
    for key in sorted({k.rsplit(".", 1)[0] for k in (*first, *second)}):
        a_parts, b_parts = [], []
        for src, other, s in ((first, second, scales[0]), (second, first, scales[1])):
            if key + ".lora_a" in src:
                a_parts.append(src[key + ".lora_a"])
                b_parts.append(src[key + ".lora_b"] * s)
            else:
                a, b = other[key + ".lora_a"], other[key + ".lora_b"]
                a_parts.append(mx.zeros(a.shape))
                b_parts.append(mx.zeros(b.shape))
        out[key + ".lora_a"] = mx.concatenate(a_parts, axis=1)
        out[key + ".lora_b"] = mx.concatenate(b_parts, axis=0)
    return out


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory) -> dict:
    from huggingface_hub import snapshot_download

    snapshot = snapshot_download(tiny_model, local_files_only=True)
    root = tmp_path_factory.mktemp("adapters")
    a, b = random_adapter(snapshot, 2, 1), random_adapter(snapshot, 1, 2)
    return {"snapshot": snapshot,
            "a": write_adapter(root / "alpha", a, 1.5, snapshot),
            "b": write_adapter(root / "beta", b, 0.5, None, layers=1),
            "ab": write_adapter(root / "alpha-beta", _stacked(a, b, (1.5, 0.5)), 1.0, None),
            "foreign": write_adapter(root / "foreign", a, 1.0, "someone/other-model"),
            "bad": write_adapter(root / "bad", {**a, sorted(a)[-1]: a[sorted(a)[-1]][:, :7]}, 1.0, None)}


@pytest.fixture
def app(served, adapters):
    return served("--adapter", str(adapters["a"]), "--no-worker")


def _reference(snapshot: str, adapter: Path | None) -> str:
    from mlx_lm import generate, load

    model, tokenizer = load(snapshot, adapter_path=str(adapter) if adapter else None)
    return generate(model, tokenizer, PROMPT, max_tokens=10, verbose=False)


def _complete(app, **extra) -> dict:
    r = app.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 10, "temperature": 0, **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_requests_pick_adapters_and_match_mlx_lm(app, adapters):
    snapshot = adapters["snapshot"]
    base, alpha, both = (_reference(snapshot, p) for p in (None, adapters["a"], adapters["ab"]))
    assert len({base, alpha, both}) == 3, "the test adapters must change the greedy reply"

    listed = app.get("/v1/adapters").json()
    assert [a["id"] for a in listed["adapters"]] == ["alpha"] and listed["default"] == "alpha"
    assert listed["adapters"][0]["mounted_layers"] == 14 and listed["adapters"][0]["ram_bytes"] > 0

    assert _complete(app)["choices"][0]["text"] == alpha  # --adapter is the default
    assert _complete(app, adapter="none")["choices"][0]["text"] == base
    mounted = app.post("/v1/adapters", json={"id": "beta", "path": str(adapters["b"])}).json()
    assert mounted == {"id": "beta", "mounted_layers": 7, "rank": 4, "scale": 0.5, "ram_bytes": mounted["ram_bytes"]}
    assert _complete(app, adapter="alpha+beta")["choices"][0]["text"] == both
    assert _complete(app, adapter="alpha,beta")["choices"][0]["text"] == both
    assert _complete(app, adapter="alpha")["choices"][0]["text"] == alpha

    chat = app.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "adapter": "beta"}).json()
    assert chat["choices"][0]["message"]["role"] == "assistant"
    msg = app.post("/v1/messages", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "adapter": "alpha+beta"})
    assert msg.status_code == 200 and msg.json()["type"] == "message"
    resp = app.post("/v1/responses", json={"input": "hi", "max_output_tokens": 4, "adapter": "none"})
    assert resp.status_code == 200 and resp.json()["object"] == "response"


def test_mount_refusals_mount_nothing(app, adapters):
    before = app.get("/v1/adapters").json()["adapters"]
    for body, needle in [({"id": "x"}, "path: Field required"), ({"path": str(adapters["b"])}, "id: Field required"),
                         ({"id": 7, "path": str(adapters["b"])}, "id: Input should be a valid string"),
                         ({"id": "bad", "path": str(adapters["bad"])}, "do not fit"),
                         ({"id": "gone", "path": str(adapters["a"].parent / "no-such-folder")},
                          "holds no adapters.safetensors"),
                         ({"id": "none", "path": str(adapters["b"])}, "adapter id must")]:
        r = app.post("/v1/adapters", json=body)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (body, r.text)
    assert app.get("/v1/adapters").json()["adapters"] == before
    assert app.delete("/v1/adapters/nobody").json() == {
        "error": {"message": "adapter nobody not mounted", "type": "invalid_request_error",
                  "param": "adapter", "code": "adapter_not_mounted"}}
    unknown = app.post("/v1/completions", json={"prompt": "x", "adapter": "alpha+ghost"})
    assert unknown.status_code == 400 and "ghost" in unknown.json()["error"]["message"]
    assert app.post("/v1/completions", json={"prompt": "x", "adapter": 3}).status_code == 400


def test_available_lists_folders_with_compatibility(app, adapters, homes):
    _, hearth_home = homes
    on_disk = hearth_home / "adapters" / "from-a-job"
    on_disk.mkdir(parents=True, exist_ok=True)
    for name in ("adapters.safetensors", "adapter_config.json"):
        (on_disk / name).write_bytes((adapters["a"] / name).read_bytes())
    app.post("/v1/adapters", json={"id": "foreign", "path": str(adapters["foreign"])})
    rows = {a["id"]: a for a in app.get("/v1/adapters/available").json()["adapters"]}
    assert rows["alpha"]["mounted"] and rows["alpha"]["compatible"]
    assert rows["from-a-job"]["compatible"] and not rows["from-a-job"]["mounted"]
    assert rows["foreign"]["mounted"] and not rows["foreign"]["compatible"]
    assert rows["foreign"]["base_model"] == "someone/other-model"
    app.delete("/v1/adapters/foreign")


def test_cache_namespaces_and_mixed_batches(app, adapters):
    prompt = "one two three four five six seven eight nine ten " * 3
    first = _complete(app, prompt=prompt, adapter="none", max_tokens=2)
    again = _complete(app, prompt=prompt, adapter="none", max_tokens=2)
    other = _complete(app, prompt=prompt, adapter="alpha", max_tokens=2)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # base KV is not alpha's
    assert first["choices"][0]["text"] == again["choices"][0]["text"]

    specs = ["none", "alpha", "beta", "alpha+beta"] * 3
    solo = {spec: _complete(app, adapter=spec)["choices"][0]["text"] for spec in set(specs)}
    with ThreadPoolExecutor(len(specs)) as pool:
        mixed = list(pool.map(lambda s: _complete(app, adapter=s)["choices"][0]["text"], specs))
    assert mixed == [solo[s] for s in specs]

    # Replacing an adapter under the same id never reuses KV computed with the old weights.
    app.post("/v1/adapters", json={"id": "beta", "path": str(adapters["a"])}).raise_for_status()
    assert _complete(app, adapter="beta")["choices"][0]["text"] == solo["alpha"]
    removed = app.delete("/v1/adapters/beta").json()
    assert removed == {"id": "beta", "removed_layers": 14}
    assert app.post("/v1/completions", json={"prompt": "x", "adapter": "beta"}).status_code == 400
    stats = app.get("/stats").json()["adapters"]
    assert stats["mounted"] == ["alpha"] and stats["default"] == "alpha"


def test_merge_folds_two_adapters_into_their_stack(app, adapters):
    app.post("/v1/adapters", json={"id": "beta2", "path": str(adapters["b"])}).raise_for_status()
    stacked = _complete(app, adapter="alpha+beta2")["choices"][0]["text"]
    r = app.post("/api/finetune/merge",
                   json={"adapter_a": str(adapters["a"]), "adapter_b": str(adapters["b"])}).json()
    assert r["ok"] and r["stats"]["scales"] == [1.5, 0.5]  # each adapter's own scale by default
    assert r["stats"]["layers_merged"] == 7 and r["stats"]["layers_only_in_one"] == 7
    assert r["stats"]["total_keys_out"] == 28
    app.post("/v1/adapters", json={"id": "merged", "path": r["merged_path"]}).raise_for_status()
    assert _complete(app, adapter="merged")["choices"][0]["text"] == stacked
    assert _reference(adapters["snapshot"], Path(r["merged_path"])) == stacked  # mlx-lm loads it too
    for body, needle in [({"adapter_a": str(adapters["a"])}, "adapter_b: Field required"),
                         ({"adapter_a": str(adapters["a"]), "adapter_b": str(adapters["a"].parent / "nowhere")},
                          "holds no adapters"),
                         ({"adapter_a": str(adapters["a"]), "adapter_b": str(adapters["b"]), "scales": [1]},
                          "scales: List should have at least 2 items")]:
        bad = app.post("/api/finetune/merge", json=body)
        assert bad.status_code == 400 and needle in bad.json()["error"] and not bad.json()["ok"]
    for name in ("merged", "beta2"):
        app.delete(f"/v1/adapters/{name}").raise_for_status()


def test_a_merge_of_weights_that_are_no_lora_is_a_400_naming_the_layer(app, adapters, tmp_path):
    """LoRA weights of the wrong shape (a vector, or ranks that disagree) are refused before anything
    is written, as is a scale float32 weights cannot hold: no 500, no merged adapter that fails to mount."""
    import numpy as np
    from safetensors.numpy import save_file

    def folder(name: str, a_shape: tuple, b_shape: tuple, b: float = 1.0) -> str:
        (tmp_path / name).mkdir()
        save_file({"model.layers.0.self_attn.q_proj.lora_a": np.ones(a_shape, np.float32),
                   "model.layers.0.self_attn.q_proj.lora_b": np.full(b_shape, b, np.float32)},
                  str(tmp_path / name / "adapters.safetensors"))
        return str(tmp_path / name)

    vector, ranks = folder("vector", (64,), (64,)), folder("ranks", (64, 2), (3, 64))
    from core import home

    merged = set(home.adapters().glob("merged-*"))
    for first, second, needle in [(vector, vector, "vector: model.layers.0.self_attn.q_proj's lora_a [64]"),
                                  (ranks, str(adapters["a"]), "ranks: model.layers.0.self_attn.q_proj's lora_a")]:
        bad = app.post("/api/finetune/merge", json={"adapter_a": first, "adapter_b": second})
        assert bad.status_code == 400 and needle in bad.json()["error"], bad.text
    huge = app.post("/api/finetune/merge", json={"adapter_a": str(adapters["a"]), "adapter_b": str(adapters["b"]),
                                                  "scales": [1e39, 1]})
    assert huge.status_code == 400 and "scales must be numbers a float32 holds" in huge.json()["error"]
    big = folder("big", (64, 2), (2, 64), b=100.0)  # 100 x 1e38: a scale float32 holds, a product it does not
    past = app.post("/api/finetune/merge", json={"adapter_a": big, "adapter_b": big, "scales": [1e38, 1]})
    assert past.status_code == 400 and "past what float32 holds" in past.json()["error"], past.text
    assert set(home.adapters().glob("merged-*")) == merged
