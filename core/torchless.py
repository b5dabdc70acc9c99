"""transformers without torch, in Hearth's own processes.

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

HEARTH_TRANSFORMERS_TORCH=1 leaves transformers as it is.

No Django here, and no imports of the project's apps."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

TARGET = "transformers.utils.import_utils"
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


def install() -> None:
    """From now on, transformers in this process sees no torch (unless it is loaded already)."""
    if os.environ.get("HEARTH_TRANSFORMERS_TORCH", "").strip() == "1" or TARGET in sys.modules:
        return
    if not any(isinstance(finder, _Hook) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
