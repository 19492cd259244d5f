"""DataLoader lengths and shards under real launches follow PopTorch's arithmetic."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.jobs import ROOT, poprun_argv, run_job, run_mpi

pytestmark = [pytest.mark.parallel, pytest.mark.slow]

SCRIPT = str(ROOT / "tests/bin/dataloader_shards.py")


def reports(stdout: str) -> list[dict[str, Any]]:
    found = [
        json.loads(line.split("REPORT ", 1)[1]) for line in stdout.splitlines() if "REPORT " in line
    ]
    return sorted(found, key=lambda r: r["instance"])


def check_shards(found: list[dict[str, Any]], combined: int) -> None:
    """Every instance yields whole batches; within an epoch no sample is read twice."""
    for epoch in range(2):
        samples = [r["epochs"][epoch] for r in found]
        assert len({len(s) for s in samples}) == 1, "instances yield different numbers of samples"
        assert all(len(s) % combined == 0 for s in samples)
        flat = [i for s in samples for i in s]
        assert len(set(flat)) == len(flat)
        assert len(flat) == 100 // (combined * len(found)) * combined * len(found)


@pytest.mark.parametrize(
    ("replicas", "instances", "length", "combined"),
    [(4, 2, 390, 64), (8, 4, 195, 64)],
)
def test_popdist_options_under_poprun(
    replicas: int, instances: int, length: int, combined: int, backend: str
) -> None:
    launch = ["--num-replicas", str(replicas), "--num-instances", str(instances)]
    launch += ["--backend", backend]
    done = run_job(poprun_argv(*launch, sys.executable, SCRIPT, "popdist"))
    assert done.returncode == 0, done.stdout
    found = reports(done.stdout)
    assert [r["instance"] for r in found] == list(range(instances)), done.stdout
    for r in found:
        assert r["backend"] == backend
        assert (r["processes"], r["len"], r["combined"]) == (instances, length, combined)
        assert r["small_combined"] == 2 * replicas // instances
    check_shards(found, 2 * replicas // instances)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
def test_plain_options_under_mpirun(backend: str, tmp_path: Path) -> None:
    """A plain Options() reads OMPI_COMM_WORLD_*: 4 processes of one replica, 390 batches of 32."""
    done = run_mpi(4, [SCRIPT, "plain", str(tmp_path)], backend=backend)
    assert done.returncode == 0, done.stdout
    # Each report comes back in a file: bare mpirun forwards output in chunks, not lines.
    found = sorted(
        (json.loads(f.read_text()) for f in tmp_path.glob("report-*.json")),
        key=lambda r: r["instance"],
    )
    assert len(found) == 4, done.stdout
    for r in found:
        assert r["backend"] == backend
        assert (r["processes"], r["len"], r["combined"]) == (4, 390, 32)
    check_shards(found, 2)
