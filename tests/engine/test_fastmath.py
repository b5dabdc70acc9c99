"""The polynomial exp behind the CPU SwiGLU: accurate to about an ulp,
differentiable, and rebinding only the model's own mlx-lm modules (and
only when asked, or when it measures faster)."""
from __future__ import annotations

import pytest

from inference.engine import fastmath


@pytest.fixture
def restore_swiglu():
    """`install` rebinds a process-wide name: put mlx-lm's back afterwards,
    for the tests in this process that compare with mlx-lm."""
    fastmath.restore()
    yield
    fastmath.restore()


def test_exp_and_swiglu_match_mlx_within_an_ulp_or_two(restore_swiglu):
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models import activations

    x = mx.concatenate([mx.linspace(-87, 88, 20001), mx.random.normal((4096,)) * 5])
    exact = np.exp(np.array(x, dtype=np.float64))
    assert (np.abs(np.array(fastmath.exp(x)) - exact) / exact).max() < 2e-7  # float32's ulp is 1.2e-7
    gate = mx.random.normal((8, 512), key=mx.random.key(1)) * 4
    up = mx.random.normal((8, 512), key=mx.random.key(2))
    fast = fastmath.make_swiglu(activations.swiglu)
    diff = mx.abs(fast(gate, up) - activations.swiglu(gate, up))
    assert diff.max().item() <= 1e-6 * mx.abs(activations.swiglu(gate, up)).max().item() + 1e-30
    assert diff.max().item() > 0  # the polynomial, not mlx-lm's exp
    # a single-row decode step's MLP is below FAST_FROM: mlx-lm's own path, bit for bit
    assert gate[:1].size < fastmath.FAST_FROM <= gate.size
    assert mx.array_equal(fast(gate[:1], up[:1]), activations.swiglu(gate[:1], up[:1])).item()
    far = fast(mx.array([-1e20, -90.0, -200.0, 90.0, 1e20]), mx.array([1e20, 1e30, 5.0, 1.0, 2.0]))
    assert far.tolist()[:3] == [0.0, 0.0, 0.0]  # no overflow at the ends
    assert far.tolist()[3:] == mx.array([90.0, 2e20]).tolist()
    # other dtypes take mlx-lm's own path, unchanged
    half = gate.astype(mx.float16), up.astype(mx.float16)
    assert mx.array_equal(fast(*half), activations.swiglu(*half)).item()
    # training through it works (2^k is a constant to autodiff)
    grads = [mx.grad(lambda g, f=f: f(g, up).sum())(gate) for f in (fast, activations.swiglu)]
    assert mx.allclose(grads[0], grads[1], rtol=1e-3, atol=1e-5).item()


def test_install_rebinds_the_models_modules_and_keeps_greedy_tokens(tiny_model, monkeypatch, restore_swiglu):
    import mlx.core as mx
    from huggingface_hub import snapshot_download
    from mlx_lm import load
    from mlx_lm.models import activations, llama

    model, _ = load(snapshot_download(tiny_model, local_files_only=True))
    prompt = mx.array([list(range(3, 40))])
    before = model(prompt)
    mx.eval(before)
    monkeypatch.setenv("HEARTH_FAST_SWIGLU", "0")
    assert not fastmath.install(model) and llama.swiglu is activations.swiglu
    monkeypatch.setenv("HEARTH_FAST_SWIGLU", "1")
    assert fastmath.install(model) and getattr(llama.swiglu, "hearth_fast", False)
    assert fastmath.install(model)  # a second model of the same family finds it in place
    after = model(prompt)
    monkeypatch.setenv("HEARTH_FAST_SWIGLU", "0")  # and a later model told not to puts mlx-lm's back
    assert not fastmath.install(model) and llama.swiglu is activations.swiglu
    assert mx.array_equal(before.argmax(-1), after.argmax(-1)).item()
    assert mx.abs(before - after).max().item() < 1e-4
