"""The environment's secrets are one list, `core.procs.SECRET_ENV`: every
name of a key or token that the code reads is in it, and no other module
keeps a list of its own. (That a tool's command sees none of them:
tests/chat/test_chat_tools.py.)"""
from __future__ import annotations

import ast
import re

from core import procs
from tests.helpers import ROOT

PACKAGES = ("core", "inference", "hub", "jobs", "chat", "memory", "config")
SECRET_NAME = re.compile(r"[A-Z][A-Z0-9_]*_(KEY|TOKEN|SECRET|PASSWORD)")


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path.relative_to(ROOT), ast.parse(path.read_text())


def test_every_secret_the_code_names_is_in_the_one_list():
    named = {(str(path), text) for path, tree in _modules() for text in _strings(tree) if SECRET_NAME.fullmatch(text)}
    assert {text for _, text in named}, "no secret names found: the pattern is wrong"
    assert sorted(pair for pair in named if pair[1] not in procs.SECRET_ENV) == []


def test_no_other_module_keeps_a_list_of_secrets():
    lists = [(str(path), node.lineno) for path, tree in _modules() if str(path) != "core/procs.py"
             for node in ast.walk(tree) if isinstance(node, (ast.Tuple, ast.List, ast.Set))
             and sum(text in procs.SECRET_ENV for text in _strings(node)) > 1]
    assert lists == []
