"""The executor's examples run as documented: train_digits under poprun, the listing
launched by plain mpirun; on both collective backends."""

from __future__ import annotations

import re
import sys

import pytest

from tests.support.jobs import MPIRUN, ROOT, poprun_argv, run_job, run_mpi

pytestmark = [pytest.mark.parallel, pytest.mark.slow]
POPRUN = ROOT / ".venv/bin/poprun"


@pytest.mark.skipif(MPIRUN is None, reason="needs mpirun")
def test_train_digits_under_poprun(backend: str) -> None:
    # The installed console script when there is one, else the same CLI as `python -m poprun`.
    launcher = [str(POPRUN)] if POPRUN.exists() else poprun_argv()
    cmd = [
        *launcher,
        "--num-instances",
        "2",
        "--num-replicas",
        "4",
        "--backend",
        backend,
        sys.executable,
        "examples/train_digits.py",
    ]
    done = run_job(cmd)
    out = done.stdout
    assert done.returncode == 0, out
    match = re.search(
        r"global test accuracy ([0-9.]+) \((\d+)/(\d+) samples, 2 instance\(s\) x 2 replica", out
    )
    assert match, out
    assert float(match.group(1)) >= 0.9
    assert match.group(3) == "450"  # every test sample counted once over the instances
    assert "weights identical on every instance" in out
    assert out.count("global test accuracy") == 1  # printed by instance 0 only


@pytest.mark.skipif(MPIRUN is None, reason="needs mpirun")
def test_distributed_without_poprun_under_mpirun(backend: str) -> None:
    done = run_mpi(2, ["examples/distributed_without_poprun.py"], timeout=180, backend=backend)
    assert done.returncode == 0, done.stdout
    for pid in (0, 1):
        assert f"process {pid}: call 0, combined batch (160, 3, 2), output (4, 2)" in done.stdout
