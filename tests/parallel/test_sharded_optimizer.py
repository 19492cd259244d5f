"""``useReplicatedTensorSharding(True)`` under poprun with 2 instances, on both backends: the
optimizer state is sharded over the instances and the weights are the unsharded run's, bit for
bit (the checks are in ``tests/bin/sharded_optimizer.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, poprun_argv, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.slow]

SCRIPT = str(ROOT / "tests/bin/sharded_optimizer.py")


def test_sharded_optimizer_state_keeps_the_weights(backend: str, tmp_path: Path) -> None:
    launch = ["--num-replicas", "2", "--num-instances", "2", "--backend", backend]
    done = run_job(poprun_argv(*launch, sys.executable, SCRIPT, str(tmp_path)), timeout=180)
    assert done.returncode == 0, done.stdout
    assert sorted(
        line.split("OK ", 1)[1] for line in done.stdout.splitlines() if "OK " in line
    ) == [
        "0",
        "1",
    ], done.stdout
