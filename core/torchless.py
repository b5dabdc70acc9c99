"""transformers without torch, and without rescanning itself, in Hearth's
own processes.

Hearth runs every model on MLX. transformers gives it tokenizers, chat
templates and image processors, none of which needs torch; but torch is
installed (xgrammar requires it), and transformers imports torch whenever
it finds it: about 2 s of CPU at every start of `hearth serve`, a router's
model process, a job worker or a job child, near half of a server's start
on a 2-core machine. transformers 4 read `USE_TORCH=0` for this;
transformers 5 has no switch, so `install` answers transformers' own
package check (`transformers.utils.import_utils._is_package_available`)
for torch and its companions with "not installed", as it runs, before
transformers asks. xgrammar still imports torch itself, in the processes
that compile or enforce a grammar, when one is first asked for.

transformers 5 also reads its own source at every import: it builds the
"import structure" of its lazy modules by scanning about 3,000 files of
`transformers/` for `__all__` lists and backend decorators, about 1 s of
CPU at each start of a process that loads a tokenizer. The result depends
on those files only, so `install` keeps it on disk (`structures_cache()`,
one JSON file per transformers install under the user's cache folder) and
reads it back while every `.py` file under `transformers/` has the size and
mtime it had when the file was written (a walk of stats, about 40 ms).
transformers has no such cache of its own, which is why it is done here.

HEARTH_TRANSFORMERS_TORCH=1 leaves transformers as it is (both changes).

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import functools
import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

TARGET = "transformers.utils.import_utils"
FORMAT = 1  # what a cache entry holds; a change here is a new signature
HIDDEN = ("torch", "torchvision", "torchaudio", "torchao")


class _Hook(importlib.abc.MetaPathFinder):
    """Finds transformers' import_utils as the path finder would, and patches
    it the moment it has run (before transformers' own package init asks it
    anything)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch(module) -> None:
    original = module._is_package_available

    def available(pkg_name: str, return_version: bool = False):
        if pkg_name in HIDDEN:
            return (False, "N/A") if return_version else False
        return original(pkg_name, return_version)

    module._is_package_available = available
    if module.__file__:  # the package's folder, two up from transformers/utils/import_utils.py
        root = os.path.dirname(os.path.dirname(os.path.abspath(module.__file__)))
        module.define_import_structure = _cached_structures(module.define_import_structure, root)


def structures_cache() -> Path:
    """The folder of the import-structure caches: one file per transformers install."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hearth" / "transformers-imports"


def _signature(root: str) -> str:
    """The sizes and mtimes of every `.py` file under `root`, hashed: what the
    scan reads, so a changed or added file makes a new signature."""
    digest = hashlib.sha256(root.encode())
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                stat = os.stat(os.path.join(folder, name))
                digest.update(f"{folder}/{name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()


def _cached_structures(define, root: str):
    """`define_import_structure`, answered from the on-disk cache when its
    signature still holds; a miss computes and stores. Any failure to find,
    read, decode or write the cache only means computing, as transformers
    does. Threads of one process share the entries under a lock; processes
    starting together each write whole files (the last one stays)."""
    compute = getattr(define, "__wrapped__", define)
    state: dict = {}
    lock = threading.Lock()

    def load() -> dict:  # under `lock`
        if "entries" not in state:
            state["entries"] = {}
            state["signature"] = f"{FORMAT}:{_signature(root)}"
            state["path"] = structures_cache() / f"{hashlib.sha256(root.encode()).hexdigest()[:16]}.json"
            stored = json.loads(state["path"].read_text())
            if isinstance(stored, dict) and stored.get("signature") == state["signature"] \
                    and isinstance(stored.get("entries"), dict):
                state["entries"] = stored["entries"]
        return state["entries"]

    @functools.lru_cache(maxsize=None)
    def cached(module_path: str, prefix: str | None = None):
        key = f"{os.path.relpath(os.path.abspath(module_path), root)}|{prefix or ''}"
        try:
            with lock:
                found = load().get(key)
            if found is not None:
                return {frozenset(backends): {name: set(objects) for name, objects in modules.items()}
                        for backends, modules in found}
        except Exception:  # noqa: BLE001 (no home, a file gone mid-walk, a damaged cache: compute instead)
            pass
        structure = compute(module_path, prefix)
        try:
            with lock:
                entries = load()
                entries[key] = [[sorted(backends), {name: sorted(objects) for name, objects in modules.items()}]
                                for backends, modules in structure.items()]
                _store(state["path"], {"signature": state["signature"], "entries": entries})
        except Exception:  # noqa: BLE001 (as above: the cache only ever saves work)
            pass
        return structure

    return cached


def _store(path: Path, content: dict) -> None:
    """Write `content` whole or not at all (processes starting together race here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as out:
        try:
            json.dump(content, out)
        except BaseException:
            out.close()
            os.unlink(out.name)
            raise
    os.replace(out.name, path)


def install() -> None:
    """From now on, transformers in this process sees no torch (unless it is loaded already)."""
    if os.environ.get("HEARTH_TRANSFORMERS_TORCH", "").strip() == "1" or TARGET in sys.modules:
        return
    if not any(isinstance(finder, _Hook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
