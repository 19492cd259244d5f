"""The foundation: typed packages, a Horovod built the way the set-up promises, CI's command.

That ``import popdist`` stays light is checked in a fresh interpreter: tests/launch/test_packaging.py.
"""

from __future__ import annotations

import pytest

from tests.support.jobs import ROOT

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "package", ["poprun", "popdist", "popdist_torch", "popdist_lightning", "_popdist_poptorch"]
)
def test_packages_are_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()


def test_horovod_has_pytorch_mpi_and_gloo() -> None:
    hvd = pytest.importorskip("horovod.torch", reason="Horovod is installed by `make test`")
    assert hvd.mpi_built() and hvd.gloo_built()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make demo" in readme
    assert [
        line for line in ci.splitlines() if line and not line.startswith(("#", "set ", "cd "))
    ] == ["make test"]
