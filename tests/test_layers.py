"""Imports point down the layers of docs/layout.md, statically: every `moespec.X` a module names, at
the top or inside a function, is in its own package or one below it. No package circle can form."""

import ast
from pathlib import Path

import moespec

SRC = Path(moespec.__file__).parent
# Top to bottom; the single-file modules at the package root form the lowest layer.
LAYERS = ["cli", "chain", "report", "bench", "checks", "costmodel", "engine", "models", "backends", "moe", "data"]
ROOT = len(LAYERS)


def layer(module: str) -> int:
    """The layer of `moespec.a.b` (a package of LAYERS, else the root's single files)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else ROOT


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return {n for n in names if n == "moespec" or n.startswith("moespec.")}


def upward_imports() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = "moespec." + ".".join(path.relative_to(SRC).with_suffix("").parts)
        here = layer(module)
        if module == "moespec.__init__":
            continue  # the public API re-exports from every layer, each on first use
        for name in imported(path):
            if name != "moespec" and layer(name) < here:
                found.append(f"{module} imports {name}")
    return found


def test_every_import_points_down_the_layers():
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from moespec.cli.app import app\n")
    assert "moespec.cli.app" in imported(bad) and layer("moespec.cli.app") < layer("moespec.backends.x")
