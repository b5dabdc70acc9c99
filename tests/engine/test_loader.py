"""Loading: float32 by default on the CPU, the stored dtype on request."""
import pytest

from inference.engine import loader
from inference.engine.errors import ModelNotFound
from tests.helpers import build_tiny_model


@pytest.fixture(scope="module")
def bf16_model(homes):
    build_tiny_model(homes[0] / "hub", "hearth-test/tiny-bf16", dtype="bfloat16")
    return "hearth-test/tiny-bf16"


@pytest.fixture(scope="module")
def quantized_model(homes):
    build_tiny_model(homes[0] / "hub", "hearth-test/tiny-q4", quantize=True)
    return "hearth-test/tiny-q4"


def test_bf16_is_upcast_to_float32(bf16_model):
    assert loader.load(bf16_model).dtype == "float32"


def test_keep_dtype_keeps_bf16(bf16_model):
    assert loader.load(bf16_model, keep_dtype=True).dtype == "bfloat16"


def test_quantized_is_dequantized_to_float32(quantized_model):
    import mlx.core as mx
    import mlx.nn as nn

    loaded = loader.load(quantized_model)
    assert loaded.dtype == "float32"
    assert not any(isinstance(m, nn.QuantizedLinear) for _, m in loaded.model.named_modules())
    logits = loaded.model(mx.array([[1, 2, 3]]))
    assert logits.dtype == mx.float32 and logits.shape[-1] == loaded.vocab_size


def test_quantized_kept_when_asked(quantized_model):
    import mlx.nn as nn

    loaded = loader.load(quantized_model, keep_dtype=True)
    assert any(isinstance(m, nn.QuantizedLinear) for _, m in loaded.model.named_modules())


def test_resolve_refuses_unknown_refs(tmp_path):
    with pytest.raises(ModelNotFound, match="nobody/nothing"):
        loader.resolve("nobody/nothing")
    with pytest.raises(ModelNotFound, match="no config.json"):
        loader.resolve(str(tmp_path))


def test_float32_estimate_counts_quantized_weights_unpacked(quantized_model, bf16_model):
    q = loader.load(quantized_model, keep_dtype=True)
    full = loader.load(bf16_model, keep_dtype=True)
    # Same architecture: the dequantized estimate matches the dense one.
    assert loader._float32_bytes(q.model) == loader._float32_bytes(full.model)
