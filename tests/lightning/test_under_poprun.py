"""IPUStrategy under poprun, 2 instances × 2 local replicas: the weights of
``Trainer(accelerator="cpu")`` on the same global batches, ``sync_dist`` logging, checkpoints
from instance 0 only that resume exactly, each instance's autoreport, and a failing
instance reported without a hang.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.lightning.cases import SAMPLES, cpu_reference
from tests.support.jobs import MPIRUN, ROOT, job_env, poprun_argv, run_job

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun"),
    pytest.mark.filterwarnings("ignore"),
]
SCRIPT = str(ROOT / "tests/lightning/bin/fit_under_poprun.py")
MICRO, INSTANCES, REPLICAS = 2, 2, 4


def poprun_fit(out: Path, *args: str, timeout: float = 300, backend: str = "horovod") -> str:
    done = run_job(
        poprun_argv(
            "--num-instances",
            str(INSTANCES),
            "--num-replicas",
            str(REPLICAS),
            "--backend",
            backend,
            sys.executable,
            SCRIPT,
            str(out),
            *args,
        ),
        env=job_env(),
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-6000:]
    return done.stdout


def results(out: Path) -> list[dict]:
    return [torch.load(out / f"result.{rank}.pt") for rank in range(INSTANCES)]


@pytest.mark.parametrize(
    ("device_iterations", "accumulation", "backend"), [(2, 1, "horovod"), (1, 2, "torch")]
)
def test_two_instances_of_two_replicas_train_like_the_cpu_trainer(
    device_iterations: int, accumulation: int, backend: str, tmp_path: Path
) -> None:
    """On either collectives backend: Lightning's reduce, broadcast and barrier go through it."""
    poprun_fit(tmp_path, str(device_iterations), str(accumulation), "--autoreport", backend=backend)
    reference = cpu_reference(REPLICAS, MICRO, accumulation, epochs=2).state_dict()
    got = results(tmp_path)
    for rank, result in enumerate(got):
        for name, value in reference.items():
            torch.testing.assert_close(
                result["state"][name], value, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {name}"
            )
        assert result["is_global_zero"] == (rank == 0)
        assert result["world_size"] == INSTANCES
        assert result["num_devices"] == REPLICAS // INSTANCES
        per_call = MICRO * REPLICAS * device_iterations * accumulation
        assert result["global_step"] == 2 * (SAMPLES // per_call)
        # each instance predicted its shard: together, every sample once
    assert sum(r["predicted"] for r in got) == SAMPLES
    # sync_dist: every instance logged the same (reduced) values
    assert got[0]["fit_metrics"] == got[1]["fit_metrics"]
    assert got[0]["test"] == got[1]["test"]
    # checkpoints: written by instance 0 only, one per epoch
    assert (tmp_path / "saves.0").read_text().split() == sorted(
        p.name for p in (tmp_path / "ckpt").glob("*.ckpt")
    )
    assert len((tmp_path / "saves.0").read_text().split()) == 2
    assert not (tmp_path / "saves.1").exists()
    # rank-zero-only code ran once, on instance 0
    assert [p.name for p in tmp_path.glob("rank_zero_only.*")] == ["rank_zero_only.0"]
    # autoreport: each instance wrote its own, one folder per graph it ran
    for rank, result in enumerate(got):
        folder = tmp_path / "report" / f"instance{rank}"
        graphs = sorted(p.name for p in folder.iterdir())
        assert graphs == ["predict", "test", "training", "validation"]
        profile = json.loads((folder / "training" / "profile.json").read_text())
        assert (profile["instance"], profile["instances"]) == (rank, INSTANCES)
        assert profile["calls"] == result["global_step"]
        assert profile["replicas"] == REPLICAS // INSTANCES


def test_resume_under_poprun_ends_where_the_uninterrupted_run_ends(tmp_path: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for d in (straight, resumed):
        d.mkdir()
    poprun_fit(straight, "2", "1", "--epochs", "3")  # a checkpoint at the end of each epoch
    (ckpt,) = (straight / "ckpt").glob("epoch=0-*.ckpt")
    poprun_fit(resumed, "2", "1", "--epochs", "3", "--resume", str(ckpt))
    for want, got in zip(results(straight), results(resumed), strict=True):
        for name, value in want["state"].items():
            assert torch.equal(got["state"][name], value), name


def test_an_exception_in_one_instance_ends_the_job_and_is_reported(tmp_path: Path) -> None:
    done = run_job(
        poprun_argv(
            "--num-instances",
            str(INSTANCES),
            "--num-replicas",
            str(REPLICAS),
            sys.executable,
            SCRIPT,
            str(tmp_path),
            "1",
            "1",
            "--fail-on",
            "1",
        ),
        env=job_env(),
        timeout=240,
    )
    assert done.returncode == 1, done.stdout[-4000:]
    assert "instance 1 failed first" in done.stdout
    assert "instance 1 fails on purpose" in done.stdout
    assert not list(tmp_path.glob("result.*.pt"))
