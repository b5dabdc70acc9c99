"""Every third-party package Hearth's own code imports is declared in pyproject.toml: among the base
dependencies, or, for what only scale-out or a device needs (Redis, PostgreSQL, MKL, CUDA), in that extra.
`make serve` installs the base alone (with the `clients` SDKs), so a package only the `test` extra (or
another package's dependencies) happened to bring would fail there, not in the suite."""
from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions

import tomllib

from tests.helpers import ROOT

PACKAGES = ("core", "inference", "hub", "serving", "jobs", "chat", "memory", "hearth", "config")
RUNTIME_EXTRAS = ("redis", "postgres", "mkl", "cuda")  # imported only where that extra is set up


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0]).lower()


def _imported() -> dict[str, set[str]]:
    """Top-level module -> the files of Hearth's own code that import it (third-party only)."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_imported_package_is_declared_where_serving_installs_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for extra in RUNTIME_EXTRAS for r in project["optional-dependencies"][extra]}
    owners = packages_distributions()
    missing = {top: sorted(files)[:3] for top, files in _imported().items()
               if not {_name(d) for d in owners.get(top, [top])} & declared}
    assert not missing, f"imported but not declared for `make serve` (pyproject.toml dependencies): {missing}"
