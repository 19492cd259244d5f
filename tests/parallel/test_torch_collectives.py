"""The torch backend's own collectives under ``mpirun -np 2``: buckets, average, broadcast."""

from __future__ import annotations

import pytest

from tests.jobs import MPIRUN, ROOT, run_mpi

pytestmark = pytest.mark.parallel


@pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun")
@pytest.mark.parametrize("cpu_allreduce", ["mpi", "gloo"])
def test_fused_buckets_average_broadcast_and_allgather(cpu_allreduce: str) -> None:
    """The same results whether CPU buckets go over the MPI lane (the default) or gloo."""
    env = {} if cpu_allreduce == "mpi" else {"POPDIST_TORCH_CPU_ALLREDUCE": cpu_allreduce}
    done = run_mpi(
        2, [str(ROOT / "tests/bin/torch_collectives.py")], timeout=120, backend="torch", env=env
    )
    assert done.returncode == 0, done.stdout
    assert "OK 0" in done.stdout and "OK 1" in done.stdout, done.stdout
    for rank in (0, 1):
        assert f"CPU allreduce {rank}: {cpu_allreduce}" in done.stdout, done.stdout
