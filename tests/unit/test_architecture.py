"""The code's shape (issue 15): small functions and classes, no private name crossing a module.

Checked on the library and executor packages by reading their source, so a change that
grows a function past the limit, or reaches into another module's private names, fails here
with the place to fix.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.jobs import ROOT

pytestmark = pytest.mark.unit

PACKAGES = ("popdist", "popdist_torch")
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 250


def _modules() -> list[tuple[Path, ast.Module]]:
    return [
        (path.relative_to(ROOT), ast.parse(path.read_text()))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def test_no_function_or_class_over_the_limit() -> None:
    too_long = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                if lines > limit:
                    too_long.append(f"{path}:{node.lineno} {node.name} has {lines} lines > {limit}")
    assert too_long == []


def test_no_private_name_is_imported_from_another_module() -> None:
    crossings = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            if node.module.split(".")[0] not in (*PACKAGES, "poprun"):
                continue
            private = [a.name for a in node.names if a.name.startswith("_")]
            if private:
                crossings.append(f"{path}:{node.lineno} from {node.module} import {private}")
    assert crossings == []


def test_the_pipeline_is_entered_only_through_its_package() -> None:
    """Outside ``popdist_torch/pipeline/``, nothing imports a pipeline module directly."""
    reach_ins = []
    for path, tree in _modules():
        if path.parts[:2] == ("popdist_torch", "pipeline"):
            continue
        for node in ast.walk(tree):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            reach_ins += [
                f"{path}:{node.lineno} {name}"
                for name in names
                if name.startswith("popdist_torch.pipeline.")
            ]
    assert reach_ins == []
    assert (ROOT / "popdist_torch" / "pipeline" / "__init__.py").is_file()
