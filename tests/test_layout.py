"""The package's layout keeps every arrow pointing down: config -> model -> (train | convert | eval | publish) ->
experiments -> commands. A module that imports from a layer above it fails here, named with the import."""

from __future__ import annotations

import ast
from pathlib import Path

import hires_hf

PACKAGE = Path(hires_hf.__file__).parent

# What each part of the package may not import (its own layer and the ones below are fine).
FORBIDDEN = {
    "configuration_hires": {"*"},  # ships as Hub remote code: transformers only
    "modeling_hires": {"*"},  # ditto, plus its sibling config (checked below)
    "training": {"experiments", "commands", "cli", "diagnostics", "publish", "conversion"},
    "conversion": {"training", "experiments", "commands", "cli", "eval", "publish"},
    "diagnostics": {"training", "experiments", "commands", "cli", "publish", "conversion"},
    "eval": {"training", "experiments", "commands", "cli", "publish", "conversion"},
    "experiments": {"commands", "cli", "publish"},
    "publish": {"experiments", "commands", "cli"},
}
LIBRARY_LEAVES = {"accounting", "twins", "errors", "io", "tables", "plotting", "loading", "stdlib_corpus"}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, first-level hires_hf module) of every import of our own package in `path` (relative or absolute)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    depth = len(path.relative_to(PACKAGE).parts) - 1  # folders between the package root and the file
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > depth:
                    continue
                base = list(path.relative_to(PACKAGE).parts[: depth - (node.level - 1)])
                parts = base + (node.module.split(".") if node.module else [])
                names = [parts[0]] if parts else [alias.name for alias in node.names]
            elif node.module and node.module.split(".")[0] == "hires_hf":
                parts = node.module.split(".")[1:]
                names = [parts[0]] if parts else [alias.name for alias in node.names]
            else:
                continue
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "hires_hf" and len(parts) > 1:
                    found.append((node.lineno, parts[1]))
    return found


def _layer(path: Path) -> str:
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def test_no_import_runs_back_up() -> None:
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = _layer(path)
        forbidden = FORBIDDEN.get(layer, set())
        if layer in LIBRARY_LEAVES:
            forbidden = {"training", "experiments", "commands", "cli", "eval", "diagnostics", "conversion", "publish"}
        for line, target in _imports(path):
            if target == layer:
                continue
            allowed_sibling = layer == "modeling_hires" and target == "configuration_hires"
            if ("*" in forbidden and not allowed_sibling) or target in forbidden:
                violations.append(f"{path.relative_to(PACKAGE)}:{line} imports hires_hf.{target}")
    assert not violations, "\n".join(violations)


def test_the_checker_sees_relative_and_absolute_imports(tmp_path, monkeypatch) -> None:
    """A guard on the guard: both spellings of an upward import are found."""
    folder = PACKAGE / "training"
    relative = _imports(folder / "loop.py")
    assert all(name != "experiments" for _, name in relative)
    fake = folder / "_layout_probe.py"
    fake.write_text("from ..experiments import harness\nimport hires_hf.commands.ladder\n")
    try:
        assert {name for _, name in _imports(fake)} == {"experiments", "commands"}
    finally:
        fake.unlink()
