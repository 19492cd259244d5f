"""N+M updates in one poprun equal N updates, a checkpoint, and M more in a new poprun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from popdist import env

pytestmark = [pytest.mark.launch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def poprun(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m poprun ARGS`` in its own session; the whole group is killed on time-out."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in env.ALL and not k.startswith(("OMPI_", "PMIX_", "HOROVOD_"))
    }
    clean.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "poprun", *args]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=clean,
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
        pytest.fail(f"poprun timed out:\n{out}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def test_resume_gives_identical_weights(tmp_path: Path) -> None:
    script = [sys.executable, str(ROOT / "tests/bin/ckpt_resume.py")]
    launch = ["--num-replicas", "4", "--num-instances", "2"]
    for phase in ("full", "first", "resume"):
        done = poprun([*launch, *script, phase, str(tmp_path)])
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
