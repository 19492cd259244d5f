"""examples/lightning_digits.py runs as its docstring says: under poprun on "ipu"."""

from __future__ import annotations

import re
import sys

import pytest

from tests.support.jobs import MPIRUN, job_env, poprun_argv, run_job

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun"),
]


def test_lightning_digits_under_poprun_learns_and_reports_once() -> None:
    done = run_job(
        poprun_argv(
            "--num-instances", "2", "--num-replicas", "4",
            sys.executable, "examples/lightning_digits.py", "--accelerator", "ipu", "--epochs", "3",
        ),
        env=job_env(),
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]
    reports = re.findall(
        r"ipu: 2 instance\(s\) x 2 device\(s\), test accuracy ([0-9.]+)", done.stdout
    )
    assert len(reports) == 1, done.stdout[-4000:]
    assert float(reports[0]) > 0.85
