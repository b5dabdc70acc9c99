"""The layer order of the project, held by its imports.

Lowest first: core -> inference/engine -> inference/protocols -> hub ->
serving -> jobs -> chat -> memory -> hearth -> config. A unit
never imports a unit above it, at module level or inside a function, so no
two units import each other; a higher app extends a lower one by
registering into it. The engine imports no web framework, and of `core`
only the modules that import none either."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT as PROJECT

ROOT = PROJECT  # rebound by the test that runs the checks on a made-up tree

ORDER = ["core", "inference/engine", "inference/protocols", "hub", "serving", "jobs", "chat", "memory", "hearth",
         "config"]
PACKAGES = ("core", "inference", "hub", "serving", "jobs", "chat", "memory", "hearth", "config")
WEB = ("django", "ninja", "channels", "daphne", "twisted", "huey")


def unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "inference":  # two units: the engine below the protocol layer
        return f"inference/{parts[1]}" if len(parts) > 1 and parts[1] in ("engine", "protocols") else None
    return parts[0] if parts[0] in PACKAGES else None


def _package_of(path: Path) -> list[str]:
    """The package a file's relative imports start from (its folder, for a module and an __init__ alike)."""
    return list(path.relative_to(ROOT).parent.parts)


def _imports(path: Path):
    """(module imported, line) for every import in the file, however deep;
    relative imports are resolved against the file's package."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                package = _package_of(path)
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            if module:
                yield module, node.lineno
            for alias in node.names:  # `from inference import engine` names a unit through its member
                yield f"{module}.{alias.name}" if module else alias.name, node.lineno


def _sources():
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                yield path


def arrows(sources=None) -> dict[tuple[str, str], list[str]]:
    """(from unit, to unit) -> where, for every import between two units."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sources if sources is not None else _sources():
        rel = path.relative_to(ROOT)
        src = unit(".".join(rel.with_suffix("").parts))
        seen = set()
        for module, line in _imports(path):
            dst = unit(module)
            if dst is None or dst == src or (dst, line) in seen:
                continue
            seen.add((dst, line))
            found.setdefault((src, dst), []).append(f"{rel}:{line} imports {module}")
    return found


def against_the_order(found: dict) -> list[str]:
    rank = {name: i for i, name in enumerate(ORDER)}
    return [w for (src, dst), where in sorted(found.items()) if rank[src] < rank[dst] for w in where]


def cycles(found: dict) -> list[list[str]]:
    graph: dict[str, set[str]] = {}
    for src, dst in found:
        graph.setdefault(src, set()).add(dst)
    out, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                out.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return out


def test_no_unit_imports_one_above_it():
    assert against_the_order(arrows()) == []


def test_no_two_units_import_each_other():
    assert cycles(arrows()) == []


def _arrows_of(tmp_path, rel: str, source: str) -> dict:
    """`arrows` of one file written at `rel` under a scratch project root."""
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        return arrows([path])
    finally:
        ROOT = saved


def test_the_check_sees_an_up_arrow_inside_a_function(tmp_path):
    """A reach-up inside a function (the jobs unit importing memory) fails the test."""
    found = _arrows_of(tmp_path, "jobs/runner.py",
                       "def after_end(job):\n    from memory.synthesize import finished\n    finished(job)\n")
    assert found == {("jobs", "memory"): ["jobs/runner.py:2 imports memory.synthesize"]}
    assert against_the_order(found) == ["jobs/runner.py:2 imports memory.synthesize"]
    assert cycles({("jobs", "memory"): [], ("memory", "jobs"): []}) == [["jobs", "memory", "jobs"]]


def test_the_check_resolves_relative_imports(tmp_path):
    found = _arrows_of(tmp_path, "inference/protocols/openai.py", "from ..engine.types import Usage\n")
    assert found == {("inference/protocols", "inference/engine"): ["inference/protocols/openai.py:1 imports "
                                                                   "inference.engine.types"]}
    found = _arrows_of(tmp_path, "inference/engine/engine.py", "from ..protocols.output import parse\n")
    assert against_the_order(found) == ["inference/engine/engine.py:1 imports inference.protocols.output"]


def test_the_inference_package_holds_only_the_two_units_below_the_library():
    """What sits above `hub` lives in `serving`, not beside the engine."""
    inside = {path.name for path in (ROOT / "inference").iterdir() if not path.name.startswith((".", "__"))}
    assert inside == {"engine", "protocols"}


def _engine_files() -> list[Path]:
    files = list((ROOT / "inference" / "engine").rglob("*.py"))
    assert len(files) > 5, "the engine package is not where this test looks"
    return files


def test_the_engine_imports_no_web_framework():
    offenders = [f"{path.name} imports {module}" for path in _engine_files() for module, _ in _imports(path)
                 if module.split(".")[0] in WEB]
    assert offenders == []


def test_the_engine_uses_only_the_framework_free_part_of_core():
    """No core module the engine imports reaches a web framework, directly or through another core module."""
    imports = {path.stem: {m for m, _ in _imports(path)} for path in (ROOT / "core").glob("*.py")}
    web = {name for name, mods in imports.items() if {m.split(".")[0] for m in mods} & set(WEB)}
    while True:  # a core module that imports a web-bound core module is web-bound too
        more = {name for name, mods in imports.items()
                if name not in web and any(m.startswith("core.") and m.split(".")[1] in web for m in mods)}
        if not more:
            break
        web |= more
    used = {module.split(".")[1] for path in _engine_files() for module, _ in _imports(path)
            if module.startswith("core.") and len(module.split(".")) > 1}
    assert used and not used & web, used & web
