"""The torch backend's own collectives under ``mpirun -np 2``: buckets, average, broadcast."""

from __future__ import annotations

import subprocess
import sys

import pytest

from popdist import env
from tests.support.jobs import MPIRUN, ROOT, run_mpi

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


SINGLE = """
import sys, torch, popdist
popdist.init(backend="torch")
import torch.distributed as dist
t = torch.tensor([2.0]); dist.all_reduce(t)
print(popdist.collectives.active(), dist.get_backend(), dist.get_world_size(), t.item(),
      popdist.isBackendInitialized(), popdist.execute_on_instances({0}, lambda: 7),
      "horovod" in sys.modules)
try:
    popdist.init(backend="horovod")
except popdist.PopdistError as exc:
    print("second:", exc)
popdist.finalizeBackend()
print("after", popdist.isBackendInitialized(), dist.is_initialized())
popdist.init()  # POPDIST_BACKEND=torch: starts again (torch allows it)
print("again", popdist.isBackendInitialized())
"""


def test_torch_backend_starts_alone_without_horovod() -> None:
    """One process, no mpirun: the torch backend starts on an in-memory store, with no MPI."""
    proc = subprocess.run(
        [sys.executable, "-c", SINGLE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), env.BACKEND: "torch"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "torch gloo 1 2.0 True 7 False"
    assert lines[1].startswith("second: popdist.init(backend='horovod'): the torch backend")
    assert lines[2:] == ["after False False", "again True"]
