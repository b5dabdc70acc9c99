"""inference/engine must stay free of Django, ninja and Channels."""
import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "inference" / "engine"
FORBIDDEN = ("django", "ninja", "channels")


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_engine_imports_no_web_framework():
    files = sorted(ENGINE.rglob("*.py"))
    assert files, "engine package not found"
    offenders = [(f.name, name) for f in files for name in _imports(f)
                 if name.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_engine_imports_nothing_that_pulls_django_in():
    # The engine may import other inference modules only from inside itself.
    outside = [(f.name, name) for f in ENGINE.rglob("*.py") for name in _imports(f)
               if name.startswith("inference.") and not name.startswith("inference.engine")]
    assert outside == []
