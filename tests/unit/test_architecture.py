"""The code's shape (issue 15): small functions and classes, no private name crossing a module.

Checked on the launcher, library, executor and Lightning packages by reading their source,
so a change that grows a function past the limit, or reaches into another module's private
names, fails here with the place to fix.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.jobs import ROOT

pytestmark = pytest.mark.unit

#: The four packages, and the opt-in PopTorch names' hook (stdlib only, no errors of its own).
PACKAGES = ("poprun", "popdist", "popdist_torch", "popdist_lightning", "_popdist_poptorch")
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


@pytest.mark.parametrize("package", list(ERROR_ROOTS))
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


# -- the import graph (issue 24) -------------------------------------------------------------
#: Which package may import which: the direction of travel. ``popdist/poptorch.py`` (the
#: seeds' own ``popdist.poptorch`` bridge) is the one module allowed against it.
ALLOWED_ARROWS = {
    "poprun": {"popdist"},
    "popdist": set(),
    "popdist_torch": {"popdist", "_popdist_poptorch"},
    "popdist_lightning": {"popdist_torch", "popdist"},
    # the hook names popdist_torch's modules by string only: it imports no project module
    "_popdist_poptorch": set(),
}
BRIDGE = "popdist.poptorch"
MAX_MODULES_PER_FOLDER = 12


def _module_names() -> dict[str, Path]:
    names = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            names[dotted.removesuffix(".__init__")] = path
    return names


def _imported(
    name: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]
) -> set[str]:
    """The project modules one import statement names (a package means its ``__init__``)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        if node.level:
            base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        targets = [
            f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
            for alias in node.names
        ]
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Every module's imports of project modules, lazy ones (inside functions) included."""
    names = _module_names()
    known = set(names)
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges |= _imported(name, path, node, known)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_finds_a_circle() -> None:
    """The checker itself: a three-module circle and a self-contained tail."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle() -> None:
    """No two project modules import each other, directly or round a circle, lazily or not."""
    assert cycles(import_graph()) == []


def test_arrows_run_one_way() -> None:
    """``popdist_lightning → popdist_torch → popdist`` and ``poprun → popdist``, nothing back."""
    against = sorted(
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if module != BRIDGE
        and (source := module.split(".")[0]) != (dest := target.split(".")[0])
        and dest not in ALLOWED_ARROWS[source]
    )
    assert against == []


def test_no_folder_holds_more_than_twelve_modules() -> None:
    crowded = []
    for package in PACKAGES:
        for folder in [ROOT / package, *(p for p in (ROOT / package).rglob("*") if p.is_dir())]:
            count = len(list(folder.glob("*.py")))
            if count > MAX_MODULES_PER_FOLDER:
                crowded.append(f"{folder.relative_to(ROOT)}: {count} modules")
    assert crowded == []
