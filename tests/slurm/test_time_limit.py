"""The time limit is not a cliff: notice → checkpoint → exit 75 → requeue → exact resume.

Each job runs ``tests/bin/ckpt_notice.py`` under ``exec poprun`` in an ``sbatch`` script
(so poprun *is* the batch shell that ``--signal=B:USR1@N`` and ``scancel --signal=USR1
--batch`` signal). After step 4 every instance says it waits (a file) and waits for the
notice's flag, so the notice can never race a step; then ``save_on_notice`` saves and
the instances stop.

- The requeue test sends the notice the way ``sbatch --signal=B:USR1@N`` does, at a moment
  the test chooses: ``scancel --signal=USR1 --batch``. poprun exits 75, requeues the job
  (``scontrol requeue``), the job runs its script again (``SLURM_RESTART_COUNT=1``),
  resumes at step 4 and ends with the uninterrupted run's weights, bit for bit.
- The margin test gets the notice from poprun's own clock: ``--time-limit-margin`` before
  the end time poprun read from ``squeue`` (Slurm 22.05 sets no ``SLURM_JOB_END_TIME``).
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from popdist_torch.checkpoint import read_checkpoint
from tests.support.slurm_cluster import ROOT, SlurmCluster

pytestmark = [pytest.mark.slurm]

POPRUN = str(Path(sys.executable).with_name("poprun"))
#: Two nodes, one instance each (4 replicas): the notice must reach both.
ALLOC = ["-N2", "--ntasks-per-node=1"]
LAUNCH = "--num-instances 2 --num-replicas 4"
#: The longest any wait here may take (a failed test, not a hang).
PATIENCE_S = 240.0
#: A job in one of these states will not run again by itself.
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _script(directory: Path, phase: str, poprun_options: str = "") -> str:
    """The sbatch script: ``exec poprun`` so that Slurm's batch signal reaches poprun."""
    program = [sys.executable, str(ROOT / "tests/bin/ckpt_notice.py"), phase, str(directory)]
    return (
        "#!/bin/bash\n"
        f"cd {shlex.quote(str(ROOT))}\n"
        f"export PYTHONPATH={shlex.quote(str(ROOT))} OMP_NUM_THREADS=1\n"
        'echo "RUN restart=${SLURM_RESTART_COUNT:-0}"\n'
        f"exec {POPRUN} {LAUNCH} {poprun_options} {shlex.join(program)}\n"
    )


def _submit(slurm: SlurmCluster, script: str, directory: Path, options: list[str]) -> int:
    path = directory / "job.sh"
    path.write_text(script)
    path.chmod(0o755)
    done = slurm.client(
        "sbatch", "--parsable", "-o", str(directory / "job.out"), *options, *ALLOC, str(path)
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().split(";")[0])


def _state(slurm: SlurmCluster, job: int) -> dict[str, str]:
    """``scontrol show job``'s fields (JobState, Reason, Restarts, ExitCode, ...)."""
    done = slurm.client("scontrol", "-o", "show", "job", str(job))
    return dict(re.findall(r"(\w+)=(\S*)", done.stdout))


def _wait_for(
    what: str, ready: Callable[[], bool], slurm: SlurmCluster, job: int, out: Path
) -> None:
    """Poll ``ready()`` (a file, or the job's state in Slurm) until it holds; a job that
    has ended (for good) fails the wait at once."""
    give_up = time.monotonic() + PATIENCE_S
    while not ready():
        ended = _state(slurm, job).get("JobState") in ENDED
        if ended or time.monotonic() > give_up:
            text = out.read_text(errors="replace") if out.exists() else ""
            why = "the job ended" if ended else f"not within {PATIENCE_S:g} s"
            pytest.fail(f"{what}: {why}; job {_state(slurm, job)}\n{text}")
        time.sleep(0.1)


def _weights(directory: Path, phase: str) -> list[dict[str, torch.Tensor]]:
    return [torch.load(directory / f"{phase}.{i}.pt", weights_only=True) for i in range(2)]


def _uninterrupted(slurm: SlurmCluster, directory: Path) -> list[dict[str, torch.Tensor]]:
    _, output, done = slurm.sbatch(_script(directory, "full"), ALLOC, timeout=PATIENCE_S)
    assert done.returncode == 0, output
    return _weights(directory, "full")


def test_the_notice_checkpoints_requeues_and_the_job_resumes_exactly(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    out = tmp_path / "job.out"
    script = _script(tmp_path, "notice", "--requeue-on-timeout")
    job = _submit(slurm, script, tmp_path, ["--requeue", "--open-mode=append", "--time=10"])
    waiting = [tmp_path / f"waiting.{i}" for i in range(2)]
    _wait_for(
        "both instances wait at step 4", lambda: all(map(Path.exists, waiting)), slurm, job, out
    )

    sent = slurm.client("scancel", "--signal=USR1", "--batch", str(job))  # --signal=B:USR1@N
    assert sent.returncode == 0, sent.stderr

    # Requeued, Slurm holds the job for its credential lifetime (120 s by default) before it
    # may run again; the test cluster lets it go in the next second of the clock: slurmd
    # refuses a credential made in the second in which the requeue revoked the job's ("Job
    # credential revoked"), so a restart within that second failed the job.
    def requeued() -> bool:
        state = _state(slurm, job)
        return state.get("Restarts") == "1" and state.get("JobState") in ("PENDING", "RUNNING")

    _wait_for("the job requeued", requeued, slurm, job, out)
    if _state(slurm, job).get("JobState") == "PENDING":
        time.sleep(1 - time.time() % 1)  # into the next second: Slurm counts in seconds
        slurm.client("scontrol", "update", f"JobId={job}", "StartTime=now")
    give_up = time.monotonic() + PATIENCE_S
    while _state(slurm, job).get("JobState") not in ENDED and time.monotonic() < give_up:
        time.sleep(0.1)  # the requeued run trains to the end
    text = out.read_text(errors="replace")
    assert _state(slurm, job)["JobState"] == "COMPLETED", text
    first, _, second = text.partition("RUN restart=1")
    assert "received SIGUSR1: telling the instances to save now" not in first  # not without -v
    assert "poprun: the instances saved and stopped after the save-now notice" in first, text
    assert "(received SIGUSR1)" in first, text
    assert "exit code 75" in first, text
    assert "poprun: requeuing Slurm job" in first, text
    assert first.count("SAVED") == 2 and "SAVED 0 4" in first and "SAVED 1 4" in first, text
    assert "START 0 4 restart=1" in second and "START 1 4 restart=1" in second, text
    assert "OK notice 0" in second and "OK notice 1" in second, text
    assert "Forwarding signal" not in text  # mpirun's echo is poprun's to tell

    want = _uninterrupted(slurm, tmp_path)
    for i, got in enumerate(_weights(tmp_path, "notice")):
        for name, value in want[i].items():
            assert torch.equal(got[name], value), f"instance {i}: {name} differs after requeue"


def test_the_margin_notice_counts_back_from_the_end_time_squeue_reports(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """--time=2 and a margin of 110 s: the notice comes about 10 s into the job, from the end
    time poprun read with squeue; the job saves and ends with exit code 75, no requeue."""
    job, output, done = slurm.sbatch(
        _script(tmp_path, "notice", "--time-limit-margin 110"),
        [*ALLOC, "--time=2"],
        timeout=PATIENCE_S,
    )
    assert done.returncode == 75, output
    assert "--time-limit-margin=110: the Slurm job ends in" in output, output
    # Wherever the notice fell (instances still starting get it again), both saved at the
    # same step: should_stop() agrees before anyone saves.
    saved = dict(re.findall(r"SAVED (\d) (\d+)", output))
    assert set(saved) == {"0", "1"} and saved["0"] == saved["1"], output
    assert "requeuing" not in output
    assert _state(slurm, job).get("Restarts") == "0"
    assert read_checkpoint(tmp_path / "ckpt.pt")["step"] == int(saved["0"])
