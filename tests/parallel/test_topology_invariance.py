"""Topology invariance: 1x4, 2x2 and 4x1 (instances x local replicas) end where a plain
single-process torch loop over the same global batches ends (rtol 1e-5), with SGD and
AdamW, gradientAccumulation 2, deviceIterations 3, for vmap-fused and one-by-one replicas;
on both collective backends.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.jobs import MPIRUN, ROOT, run_mpi
from tests.support.topology import GLOBAL_REPLICAS, MODELS, OPTIMIZERS, reference

pytestmark = [pytest.mark.parallel, pytest.mark.slow]


@pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun")
@pytest.mark.parametrize("instances", [1, 2, 4])
def test_same_weights_whatever_the_topology(instances: int, backend: str, tmp_path: Path) -> None:
    local = GLOBAL_REPLICAS // instances
    done = run_mpi(
        instances,
        [str(ROOT / "tests/bin/executor_topology.py"), str(tmp_path), str(local)],
        backend=backend,
    )
    assert done.returncode == 0, done.stdout
    for model in MODELS:
        for opt in OPTIMIZERS:
            expected = reference(model, opt)
            for rank in range(instances):
                got = torch.load(tmp_path / f"{model}.{opt}.{rank}.pt")
                for name, value in expected.items():
                    torch.testing.assert_close(
                        got[name],
                        value,
                        rtol=1e-5,
                        atol=1e-6,
                        msg=f"{model}/{opt} rank {rank}: {name}",
                    )
