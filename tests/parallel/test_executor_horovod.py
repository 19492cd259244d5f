"""The executor's collectives path under ``mpirun -np 2``, on both backends: reduction
count, Sum, buffers."""

from __future__ import annotations

import pytest

from tests.support.jobs import MPIRUN, ROOT, run_mpi

pytestmark = pytest.mark.parallel


@pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun")
def test_one_fused_reduction_per_update_sum_and_buffers(backend: str) -> None:
    script = str(ROOT / "tests/bin/executor_reduction.py")
    done = run_mpi(2, [script], timeout=120, backend=backend)
    assert done.returncode == 0, done.stdout
    assert done.stdout.count("OK") == 2, done.stdout
