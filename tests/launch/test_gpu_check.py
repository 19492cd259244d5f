"""``make gpu-check``'s script: its plumbing on the CPU (``--cpu``: the capture seam's CPU
stand-in, the pipelined example on CPU workers), its refusal without a GPU."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.support.jobs import ROOT, run_job

pytestmark = [pytest.mark.launch, pytest.mark.slow]

SCRIPT = str(ROOT / "scripts" / "gpu_check.py")


def test_the_gpu_path_steps_run_on_the_cpu() -> None:
    tiny = ["--micro", "8", "--width", "32", "--replicas", "2"]
    done = run_job([sys.executable, SCRIPT, "--cpu", "--quick", *tiny], timeout=400)
    assert done.returncode == 0, done.stdout
    assert "1. torch backend, process group gloo on cpu: ok" in done.stdout
    assert "2. 1 instance x 2 local replicas on the device: ok" in done.stdout
    assert "micro-batch 8: local replicas / plain torch (goal ≥ 0.9) | **" in done.stdout
    # the capture seam's CPU stand-in: captured once, the same weights as eager, no sync
    assert "3. the micro-step captured once and replayed" in done.stdout
    assert "graphs on and off after 20 updates: bitwise equal" in done.stdout
    assert "syncs a training call: 0 (device reads 0)" in done.stdout
    assert "4. the pipelined example on cpu: ok" in done.stdout
    assert "| pipelined weights after 2 steps = plain torch's (rtol 1e-5) | True |" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_and_exits_2() -> None:
    done = run_job([sys.executable, SCRIPT], timeout=120)
    assert done.returncode == 2
    assert done.stdout.strip().startswith("gpu-check: no CUDA GPU is visible here")
    assert "--cpu" in done.stdout
