"""The house's rules that a reader checks by eye, checked here: no function in src/ over 60 lines
(typer commands included), and no private name (a leading underscore) imported from another file."""

import ast
from pathlib import Path

import moespec

SRC = Path(moespec.__file__).parent
LONGEST = 60


def _trees():
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC), ast.parse(path.read_text(encoding="utf-8"))


def test_no_function_is_longer_than_a_screen():
    long = [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, tree in _trees() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > LONGEST]
    assert long == []


def test_no_private_name_crosses_a_file():
    crossing = [f"{path}: from {node.module} import {alias.name}"
                for path, tree in _trees() for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("moespec")
                for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert crossing == []


def test_the_checks_see_what_they_look_for(tmp_path):
    tree = ast.parse("from moespec.x import _hidden\n" + "def f():\n" + "    pass\n" * 61)
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    (imp,) = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert fn.end_lineno - fn.lineno + 1 > LONGEST and imp.names[0].name.startswith("_")
