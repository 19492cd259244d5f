"""The torch backend's own collectives under ``mpirun -np 2``: buckets, average, broadcast."""

from __future__ import annotations

import pytest

from tests.jobs import MPIRUN, ROOT, run_mpi

pytestmark = pytest.mark.parallel


@pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun")
def test_fused_buckets_average_broadcast_and_allgather() -> None:
    done = run_mpi(2, [str(ROOT / "tests/bin/torch_collectives.py")], timeout=120, backend="torch")
    assert done.returncode == 0, done.stdout
    assert "OK 0" in done.stdout and "OK 1" in done.stdout, done.stdout
