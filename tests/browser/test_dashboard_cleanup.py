"""The Models page's disk clean-up in headless Chromium against the session
server: a model in the HF cache with a superseded revision, the plan that
says what goes and what stays and why, the confirmation, and the cache
afterwards; screenshots at desktop and phone widths."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.helpers import ARTIFACTS

OLD, NEW = "a1" * 20, "b2" * 20


@pytest.fixture
def superseded(homes):
    """models--hearth-test--gc-demo: refs/main names NEW; OLD shares the weights and has its own config."""
    root = homes[0] / "hub" / "models--hearth-test--gc-demo"
    blobs = root / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "old-config").write_text('{"model_type": "llama", "note": "old"}' + " " * 2000)
    (blobs / "new-config").write_text('{"model_type": "llama", "note": "new"}')
    (blobs / "weights").write_bytes(os.urandom(4096))
    for rev, config in ((OLD, "old-config"), (NEW, "new-config")):
        snap = root / "snapshots" / rev
        snap.mkdir(parents=True)
        (snap / "config.json").symlink_to(f"../../blobs/{config}")
        (snap / "model.safetensors").symlink_to("../../blobs/weights")
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(NEW)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_cleanup_plans_explains_and_removes_only_the_superseded_revision(page, base_url, superseded):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.goto(base_url + "/#/models")
    page.click("text=Find old revisions")
    card = page.locator('.cleanup-repo[data-repo="hearth-test/gc-demo"]')
    card.wait_for()
    assert OLD[:12] in card.locator('li[data-action="remove"]').inner_text()
    assert "no ref names it" in card.locator('li[data-action="remove"]').inner_text()
    assert "named by a ref" in card.locator('li[data-action="keep"]').inner_text()
    page.screenshot(path=str(ARTIFACTS / "desktop-models-cleanup.png"), full_page=True)
    page.set_viewport_size({"width": 375, "height": 740})
    page.wait_for_timeout(200)
    assert page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 1
    page.screenshot(path=str(ARTIFACTS / "phone-models-cleanup.png"), full_page=True)

    page.click("text=/^Remove \\d+ old revision/")
    assert (superseded / "snapshots" / OLD).is_dir()  # asked first: nothing gone yet
    page.click("text=Cancel")
    page.click("text=/^Remove \\d+ old revision/")
    page.click("text=Yes, delete")
    page.wait_for_selector('.cleanup-repo[data-repo="hearth-test/gc-demo"]', state="detached", timeout=15_000)
    assert not (superseded / "snapshots" / OLD).exists() and not (superseded / "blobs" / "old-config").exists()
    assert (superseded / "snapshots" / NEW / "model.safetensors").read_bytes() == \
        (superseded / "blobs" / "weights").read_bytes()
