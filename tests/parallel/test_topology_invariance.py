"""Topology invariance: 1x4, 2x2 and 4x1 (instances x local replicas) end where a plain
single-process torch loop over the same global batches ends (rtol 1e-5), with SGD and
AdamW, gradientAccumulation 2, deviceIterations 3, for vmap-fused and one-by-one replicas.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from popdist import env
from tests.parallel.topology_case import GLOBAL_REPLICAS, MODELS, OPTIMIZERS, reference

pytestmark = [pytest.mark.parallel, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = shutil.which("mpirun")


def _clean_env() -> dict[str, str]:
    drop = (*env.ALL,)
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith(("OMPI_", "PMIX_", "HOROVOD_"))
    }
    out["PYTHONPATH"] = str(ROOT)
    out["OMP_NUM_THREADS"] = "1"
    return out


def run_mpi(np: int, args: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``mpirun -np N python args`` in its own session; the whole group is killed on timeout."""
    assert MPIRUN is not None
    cmd = [
        MPIRUN,
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-np",
        str(np),
        sys.executable,
        *args,
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"mpirun timed out:\n{out}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


@pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun")
@pytest.mark.parametrize("instances", [1, 2, 4])
def test_same_weights_whatever_the_topology(instances: int, tmp_path: Path) -> None:
    local = GLOBAL_REPLICAS // instances
    done = run_mpi(
        instances, [str(ROOT / "tests/bin/executor_topology.py"), str(tmp_path), str(local)]
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
