"""Fixtures the protocol tests share: a llava built here from a fixed seed; the serving stack in this
process, one per test module (`app`, and its `oai` client), where a module does not make its own."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vision_model(tmp_path_factory) -> str:
    """The demo's llava recipe with two training steps (random weights in
    effect): the image path, not what the model says (tests/demo checks that)."""
    from serving.demo.vision import VisionRecipe, build

    snapshot, _, _ = build(tmp_path_factory.mktemp("vision-hub"), VisionRecipe(steps=2, warmup=1, images=48, batch=8))
    return str(snapshot)


@pytest.fixture(scope="module")
def app(served):
    return served()


@pytest.fixture(scope="module")
def oai(app):
    return app.openai()
