"""Honest tiers: the unit tier starts no process, and no tier leans on another's tests.

Checked by reading the test sources (imports), and by trying to start a process from a
unit test (``tests/unit/conftest.py`` must refuse it).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import ROOT

pytestmark = pytest.mark.unit

TESTS = ROOT / "tests"
#: Folders that are not tiers: the shared support, and child scripts every tier launches.
SHARED = {"support", "bin"}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
    return [name for name in names if name.startswith("tests.")]


def _tier(parts: tuple[str, ...]) -> str:
    """``tests/<tier>/...`` → the tier; a top-level module of ``tests`` is shared."""
    return parts[1] if len(parts) > 2 else "tests"


def test_no_tier_imports_another_tiers_tests_or_a_conftest() -> None:
    crossings = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(ROOT)
        here = _tier(rel.parts)
        for name in _imports(path):
            parts = tuple(name.split("."))
            there = parts[1] if len(parts) > 2 else parts[-1]
            if parts[-1] == "conftest" or (there not in SHARED and there != here):
                crossings.append(f"{rel} imports {name}")
    assert crossings == []


def test_the_unit_tier_refuses_to_start_a_process() -> None:
    with pytest.raises(AssertionError, match="starts no process"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_the_tier_times_plugin_names_each_test_by_its_folder() -> None:
    from tests.support.tier_times import tier_of

    assert tier_of("tests/unit/test_x.py::test_y[a/b]") == "unit"
    assert tier_of("tests/packaging/test_wheel.py::test_z") == "packaging"
    assert tier_of("tests/test_top.py::test_t") == "tests"


def test_make_test_loads_the_tier_times_plugin_and_keeps_no_tests_a_failure() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "-p tests.support.tier_times" in script
    assert '[ "$rc" = 5 ]' in script and "collected no tests" in script


def _tiers_in_conftest() -> set[str]:
    """``TIERS`` of ``tests/conftest.py``, read from its source (a tier imports no conftest)."""
    tree = ast.parse((TESTS / "conftest.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "TIERS" for t in node.targets
        ):
            return {str(tier) for tier in ast.literal_eval(node.value)}
    raise AssertionError("tests/conftest.py defines no TIERS")


def test_every_tier_folder_is_marked_and_has_its_make_target() -> None:
    """A folder of tests is a tier: its marker (``TIERS``) and ``make test-<tier>``."""
    folders = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert folders - _tiers_in_conftest() == set()
    makefile = (ROOT / "Makefile").read_text()
    assert [t for t in sorted(folders) if f"\ntest-{t}:" not in makefile] == []
