"""`trained_tools` on a model folder: asked on every chat turn and tool
listing, it reads the demo marker once and again only when the marker
changed (a checkpoint published over it, another build's marker)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict

from serving.demo import build as demo
from serving.demo import corpus


def _mark(folder, **marker) -> None:
    (folder / demo.MARKER).write_text(json.dumps(marker))


def test_the_marker_is_read_once_until_it_changes(tmp_path, monkeypatch):
    reads = []
    real = demo.read_json
    monkeypatch.setattr(demo, "read_json", lambda path, *a, **k: reads.append(path) or real(path, *a, **k))
    _mark(tmp_path, builder_version=demo.BUILDER_VERSION, recipe=asdict(demo.Recipe()))
    tools = [*corpus.APP_TOOLS, *corpus.TOOLS]

    assert demo.trained_tools(tmp_path) == tools
    first = demo.trained_tools(tmp_path)
    first.append("mutated")  # the caller's copy: the cached answer stays as it was
    assert demo.trained_tools(tmp_path) == tools
    assert len(reads) == 1  # three turns, one read

    _mark(tmp_path, builder_version=demo.BUILDER_VERSION - 1, recipe=asdict(demo.Recipe()))  # an older build's
    assert demo.trained_tools(tmp_path) is None
    assert len(reads) == 2

    # Republished with the same size and the same mtime as before: its inode still tells it apart
    stat = (tmp_path / demo.MARKER).stat()
    replacement = tmp_path / "new.json"
    replacement.write_text(json.dumps({"builder_version": demo.BUILDER_VERSION, "recipe": asdict(demo.Recipe())}))
    os.replace(replacement, tmp_path / demo.MARKER)
    os.utime(tmp_path / demo.MARKER, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert demo.trained_tools(tmp_path) == tools

    (tmp_path / demo.MARKER).unlink()
    assert demo.trained_tools(tmp_path) is None
