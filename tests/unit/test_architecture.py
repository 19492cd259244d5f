"""The code's shape (issue 15): small functions and classes, no private name crossing a module.

Checked on the launcher, library, executor and Lightning packages by reading their source,
so a change that grows a function past the limit, or reaches into another module's private
names, fails here with the place to fix.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.jobs import ROOT

pytestmark = pytest.mark.unit

PACKAGES = ("poprun", "popdist", "popdist_torch", "popdist_lightning")
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
            if node.module.split(".")[0] not in PACKAGES:
                continue
            private = [
                a.name for a in node.names if a.name.startswith("_") and not a.name.endswith("__")
            ]
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


ERROR_ROOTS = {
    "poprun": "poprun.errors.PoprunError",
    "popdist": "popdist.env.PopdistError",
    "popdist_torch": "popdist_torch.errors.PopdistTorchError",
    "popdist_lightning": "popdist_lightning.errors.IPUStrategyError",
}


def _public_exceptions(package: str) -> list[type[Exception]]:
    import importlib
    import inspect

    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        module_name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        module_name = module_name.removesuffix(".__init__").removesuffix(".__main__")
        if path.name == "__main__.py":
            continue
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, Exception)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found.append(value)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_every_error_sits_under_its_package_root(package: str) -> None:
    """One ``except`` catches everything a package raises on purpose (issue 15)."""
    import importlib

    if package == "popdist_lightning":
        pytest.importorskip("lightning", reason="popdist_lightning is the [lightning] extra")
    module_name, _, root_name = ERROR_ROOTS[package].rpartition(".")
    root = getattr(importlib.import_module(module_name), root_name)
    errors = _public_exceptions(package)
    assert root in errors
    strays = [f"{e.__module__}.{e.__qualname__}" for e in errors if not issubclass(e, root)]
    assert strays == []
