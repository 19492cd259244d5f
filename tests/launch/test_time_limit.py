"""The time-limit notice outside Slurm: ``--time-limit-margin`` counted back from ``--timeout``.

Both instances wait after step 4 for the notice (``tests/bin/ckpt_notice.py``), so it cannot
race a step: then both save at the same step, the job exits 75 (not 124: the instances
stopped by themselves), and a new poprun resumes to the uninterrupted run's weights. The
Slurm tier (``tests/slurm/test_time_limit.py``) covers SIGUSR1 from Slurm and the requeue.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from tests.support.jobs import ROOT, job_env, poprun_argv, run_job

pytestmark = [pytest.mark.launch, pytest.mark.slow]

LAUNCH = ["--num-instances", "2", "--num-replicas", "4"]


def test_the_margin_before_timeout_saves_exits_75_and_a_new_launch_resumes_exactly(
    tmp_path: Path,
) -> None:
    script = [sys.executable, str(ROOT / "tests/bin/ckpt_notice.py")]
    env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}  # not a Slurm job
    margin = ["--timeout", "200", "--time-limit-margin", "190"]  # the notice 10 s in
    first = run_job(poprun_argv(*LAUNCH, *margin, *script, "notice", str(tmp_path)), env=env)
    assert first.returncode == 75, first.stdout
    assert "--time-limit-margin=190: --timeout ends in" in first.stdout, first.stdout
    assert "the job ended at its time limit; exit code 75" in first.stdout, first.stdout
    saved = dict(re.findall(r"SAVED (\d) (\d+)", first.stdout))
    assert set(saved) == {"0", "1"} and saved["0"] == saved["1"], first.stdout

    resumed = run_job(poprun_argv(*LAUNCH, *script, "notice", str(tmp_path)), env=env)
    assert resumed.returncode == 0, resumed.stdout
    assert f"START 0 {saved['0']}" in resumed.stdout, resumed.stdout
    full = run_job(poprun_argv(*LAUNCH, *script, "full", str(tmp_path)), env=env)
    assert full.returncode == 0, full.stdout
    for i in range(2):
        want = torch.load(tmp_path / f"full.{i}.pt", weights_only=True)
        got = torch.load(tmp_path / f"notice.{i}.pt", weights_only=True)
        for name, value in want.items():
            assert torch.equal(got[name], value), f"instance {i}: {name} differs after resume"
