"""The demo build's checkpoints (`make-demo-model --background`, what
`hearth serve --build-demo` runs): a small recipe trained in this process,
in seconds. Each checkpoint is published as the repo's main revision, a
build cut short is not taken for a finished one, a later build does not
publish over a checkpoint further along, and the finished model is byte
for byte the one a build without checkpoints makes."""
from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from serving.demo import build as demo

SMALL = replace(demo.Recipe(), hidden=32, layers=1, heads=2, intermediate=64, batch=8, steps=12, warmup=2,
                examples=400)


def _weights(snapshot: Path) -> str:
    return hashlib.sha256((snapshot / "model.safetensors").read_bytes()).hexdigest()


def _snapshots(cache: Path) -> list[Path]:
    return sorted((cache / "models--hearth--demo-chat" / "snapshots").iterdir())


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The small recipe built without checkpoints."""
    cache = tmp_path_factory.mktemp("plain")
    snapshot, built = demo.build(cache, SMALL)
    assert built
    return snapshot


def test_checkpoints_are_published_as_the_training_goes(plain, tmp_path):
    seen: list[tuple[int, str, int | None, Path | None]] = []

    def published(step, loss, snapshot):
        seen.append((step, _weights(snapshot), demo.published_step(tmp_path, SMALL),
                     demo.cached_snapshot(tmp_path, SMALL)))
        assert (loss is None) == (step == 0) and _snapshots(tmp_path) == [snapshot]  # the earlier one went

    snapshot, built = demo.build(tmp_path, SMALL, published=published)
    first = min(demo.CHECKPOINTS)
    assert built and first == 0 and [s[0] for s in seen] == [0]  # untrained, then the finished model at 12
    assert seen[0][2] == first and seen[0][3] is None  # served, and not taken for a finished build
    assert seen[0][1] != _weights(snapshot)
    marker = json.loads((snapshot / demo.MARKER).read_text())
    assert "checkpoint" not in marker and demo.published_step(tmp_path, SMALL) == SMALL.steps
    # The finished model is the plain build's, in the same revision; only it is left.
    assert snapshot.name == plain.name and _weights(snapshot) == _weights(plain)
    assert demo.cached_snapshot(tmp_path, SMALL) == snapshot and _snapshots(tmp_path) == [snapshot]
    blobs = {p.name for p in (tmp_path / "models--hearth--demo-chat" / "blobs").iterdir()}
    assert blobs == {Path(p.resolve()).name for p in snapshot.iterdir()}  # checkpoint blobs removed


def test_a_build_does_not_publish_over_a_checkpoint_further_along(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "CHECKPOINTS", (0, 4, 8))
    longer = replace(SMALL, steps=10)  # checkpoints at steps 0, 4 and 8, then the finished model
    published: list[int] = []
    demo.build(tmp_path, longer, published=lambda step, loss, snap: published.append(step))
    assert published == [0, 4, 8]
    # Make what the cache holds a step-8 checkpoint, as a build stopped there leaves it.
    repo = tmp_path / "models--hearth--demo-chat"
    marker = repo / "snapshots" / (repo / "refs" / "main").read_text() / demo.MARKER
    finished = json.loads(marker.read_text())
    blob = marker.resolve()
    marker.unlink()
    blob.unlink()
    marker.write_text(json.dumps({**finished, "checkpoint": {"step": 8, "steps": 10, "loss": 1.0}}))
    assert demo.published_step(tmp_path, longer) == 8 and demo.cached_snapshot(tmp_path, longer) is None
    # The next build serves that one until it passes it: no checkpoint at 0, 4 or 8, then the finished one.
    again: list[int] = []
    _, built = demo.build(tmp_path, longer, published=lambda step, loss, snap: again.append(step))
    assert built and again == [] and demo.published_step(tmp_path, longer) == 10
