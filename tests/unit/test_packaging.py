"""The foundation: light imports, typed packages, and a Horovod built the way the set-up promises."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("module", ["popdist", "popdist.env", "poprun"])
def test_light_modules_do_not_import_torch_or_horovod(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'horovod', 'numpy'}); "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {module} pulled in {out.stdout.strip()}"


@pytest.mark.parametrize("package", ["poprun", "popdist", "popdist_torch", "popdist_lightning"])
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
