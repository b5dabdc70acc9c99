"""Sentence embeddings from a causal model: last-token pooling over the
final (normed) hidden states, L2-normalized. Runs on the engine thread."""
from __future__ import annotations

CHUNK = 32  # inputs per padded forward


def embed(model, token_lists: list[list[int]]) -> list[list[float]]:
    """One unit vector per token list. Inputs are right-padded into one
    batch per chunk; causal attention keeps each row's last real position
    blind to the padding after it, so no mask is needed."""
    import mlx.core as mx

    out: list[list[float]] = []
    for start in range(0, len(token_lists), CHUNK):
        chunk = token_lists[start:start + CHUNK]
        width = max(len(t) for t in chunk)
        batch = mx.array([t + [0] * (width - len(t)) for t in chunk])
        hidden = model.model(batch)  # [B, L, D] after the final norm
        last = hidden[mx.arange(len(chunk)), mx.array([len(t) - 1 for t in chunk])]
        last = last.astype(mx.float32)
        unit = last / mx.maximum(mx.linalg.norm(last, axis=-1, keepdims=True), 1e-12)
        out += unit.tolist()
    return out
