"""Anchored gradients with 2 instances under poprun (issue 25): each instance's anchor is
its parameter's ``.grad`` after the step, the gradient of the global batch, and the
instances read the same tensor."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.jobs import MPIRUN, ROOT, poprun_argv, run_job

pytestmark = pytest.mark.parallel
SCRIPT = str(ROOT / "tests/bin/anchored_gradient.py")


@pytest.mark.skipif(MPIRUN is None, reason="needs mpirun")
def test_anchored_gradient_under_poprun(backend: str) -> None:
    launch = ["--num-instances", "2", "--num-replicas", "4", "--backend", backend]
    done = run_job(poprun_argv(*launch, sys.executable, SCRIPT), timeout=180)
    assert done.returncode == 0, done.stdout
    records = [
        json.loads(line[line.index("{") :])
        for line in done.stdout.splitlines()
        if '"grads"' in line
    ]
    assert sorted(r["instance"] for r in records) == [0, 1], done.stdout
    assert all(r["instances"] == 2 for r in records)
    assert records[0]["grads"] == records[1]["grads"]  # the reduced gradient, bit for bit
