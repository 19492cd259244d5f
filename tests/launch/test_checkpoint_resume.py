"""N+M updates in one poprun equal N updates with a checkpoint, and M more in a new poprun."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.support.jobs import ROOT, poprun_argv, run_job

pytestmark = [pytest.mark.launch, pytest.mark.slow]


def test_resume_gives_identical_weights(backend: str, tmp_path: Path) -> None:
    script = [sys.executable, str(ROOT / "tests/bin/ckpt_resume.py")]
    launch = ["--num-replicas", "4", "--num-instances", "2", "--backend", backend]
    for phase in ("full", "resume"):
        done = run_job(poprun_argv(*launch, *script, phase, str(tmp_path)), timeout=300)
        assert done.returncode == 0, done.stdout
        assert done.stdout.count(f"OK {phase}") == 2, done.stdout
    assert (tmp_path / "ckpt.pt").is_file()
    assert not list(tmp_path.glob(".ckpt.pt.tmp-*"))
    full = [torch.load(tmp_path / f"full.{i}.pt", weights_only=True) for i in range(2)]
    resumed = [torch.load(tmp_path / f"resume.{i}.pt", weights_only=True) for i in range(2)]
    first = torch.load(tmp_path / "first.0.pt", weights_only=True)
    for i in range(2):
        for name, value in full[0].items():
            assert torch.equal(full[i][name], value), f"instances disagree on {name}"
            assert torch.equal(resumed[i][name], value), (
                f"instance {i}: {name} differs after resume"
            )
    assert any(not torch.equal(first[n], full[0][n]) for n in first)  # the M steps did something


def test_max_restarts_resumes_after_an_instance_is_killed_mid_training(tmp_path: Path) -> None:
    """poprun --max-restarts 2: instance 1 is SIGKILLed after step 5 of 11; the job is
    relaunched, resumes from the checkpoint and ends with the uninterrupted run's weights."""
    script = [sys.executable, str(ROOT / "tests/bin/ckpt_restart.py")]
    launch = ["--num-replicas", "4", "--num-instances", "2"]
    full = run_job(poprun_argv(*launch, *script, "full", str(tmp_path)), timeout=300)
    assert full.returncode == 0, full.stdout
    done = run_job(
        poprun_argv(*launch, "--max-restarts", "2", *script, "restart", str(tmp_path)), timeout=300
    )
    assert done.returncode == 0, done.stdout
    assert (tmp_path / "killed").exists()  # it really was killed once
    assert "restarting the job (restart 1 of 2)" in done.stdout, done.stdout
    assert done.stdout.count("START 0 5") == 1 and done.stdout.count("START 1 5") == 1
    for i in range(2):
        want = torch.load(tmp_path / f"full.{i}.pt", weights_only=True)
        got = torch.load(tmp_path / f"restart.{i}.pt", weights_only=True)
        for name, value in want.items():
            assert torch.equal(got[name], value), f"instance {i}: {name} differs after restart"
