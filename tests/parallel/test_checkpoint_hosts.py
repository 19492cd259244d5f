"""A checkpoint that survives its host: 6 replicas as 3 instances × 2 on hosts h0, h1, h2
(one directory per host stands for each host's disk) save after every step; after step 4
(mid-epoch) h2 is lost and h0's copy with it, and the job resumes as 2 instances × 3 on h0 and h1, in generation 1,
from h1's copy. It ends, with the deterministic reduction, on the uninterrupted run's
weights bit for bit, having consumed the uninterrupted run's multiset of samples; h0 holds a
complete copy again. The uninterrupted run saves to one path all hosts share: only one
instance writes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from popdist_torch.checkpoint import read_checkpoint
from tests.support.jobs import MPIRUN, ROOT, run_mpi

pytestmark = [
    pytest.mark.parallel,
    pytest.mark.slow,
    pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun"),
]

CHILD = str(ROOT / "tests/bin/ckpt_hosts.py")


def _run(out: Path, counts: str, hosts: str, ckpt: str, stop: int, generation: int = 0) -> None:
    args = [CHILD, str(out), counts, hosts, ckpt, str(stop), str(generation)]
    done = run_mpi(len(counts.split(",")), args, backend="horovod")
    assert done.returncode == 0, done.stdout


def _results(out: Path, stop: int, start: int, instances: int) -> list[dict]:  # type: ignore[type-arg]
    return [torch.load(out / f"{stop}.{start}.{rank}.pt") for rank in range(instances)]


def test_a_lost_hosts_copy_comes_from_a_survivor_and_the_run_ends_unchanged(
    tmp_path: Path,
) -> None:
    pytest.importorskip("horovod")
    out = tmp_path / "out"
    out.mkdir()
    for host in ("h0", "h1", "h2", "shared"):
        (tmp_path / host).mkdir()
    per_host = str(tmp_path / "{host}" / "ckpt.pt")

    _run(out, "2,2,2", "h0,h1,h2", per_host, stop=4)  # mid-epoch: 3 steps an epoch
    first = _results(out, 4, 0, 3)
    assert [r["writes"] for r in first] == [4, 4, 4]  # one copy per host, every step
    for host in ("h0", "h1", "h2"):
        assert read_checkpoint(tmp_path / host / "ckpt.pt")["step"] == 4
    (tmp_path / "h0" / "ckpt.pt").unlink()  # instance 0's copy is gone with h2 (lost)

    _run(out, "3,3", "h0,h1", per_host, stop=6, generation=1)
    resumed = _results(out, 6, 4, 2)
    assert [r["start"] for r in resumed] == [4, 4]
    assert [r["writes"] for r in resumed] == [1 + 2, 2]  # h0 stores h1's copy, then saves
    for host in ("h0", "h1"):
        state = read_checkpoint(tmp_path / host / "ckpt.pt")
        assert (state["step"], state["generation"]) == (6, 1)

    _run(out, "2,2,2", "h0,h1,h2", str(tmp_path / "shared" / "ckpt.pt"), stop=6)
    whole = _results(out, 6, 0, 3)
    assert [r["writes"] for r in whole] == [6, 0, 0]  # a shared file is written once
    assert [p.name for p in (tmp_path / "shared").iterdir()] == ["ckpt.pt"]

    consumed = sorted(i for r in first + resumed for i in r["consumed"])
    assert consumed == sorted(i for r in whole for i in r["consumed"])
    for rank, got in enumerate(resumed):
        for name, value in whole[0]["weights"].items():
            assert torch.equal(got["weights"][name], value), f"instance {rank}: {name}"
