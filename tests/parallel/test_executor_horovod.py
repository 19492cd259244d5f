"""The executor's Horovod path under ``mpirun -np 2``: reduction count, Sum, buffers."""

from __future__ import annotations

import pytest

from tests.jobs import MPIRUN, ROOT, run_mpi

pytestmark = pytest.mark.parallel


@pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun")
def test_one_fused_reduction_per_update_sum_and_buffers() -> None:
    done = run_mpi(2, [str(ROOT / "tests/bin/executor_reduction.py")], timeout=120)
    assert done.returncode == 0, done.stdout
    assert done.stdout.count("OK") == 2, done.stdout
