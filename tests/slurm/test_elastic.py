"""A lost node inside a Slurm job (``salloc --no-kill``): poprun goes on on the rest.

A cluster of its own (the node is lost for good), whose slurmctld declares a silent node
down after 5 s (``SlurmdTimeout=5``). ``poprun --min-hosts 1`` runs 2 replicas on n1 and n2
(one instance each, a checkpoint every step); once n2's instance has logged its third step,
n2 is lost as a crashed machine loses it: its slurmd, its step daemons and everything under
them SIGKILLed, by pid. poprun names n2 (mpirun loses its daemon there; a step of the job on
n2, poprun's probe, gets no answer), launches the job again on n1 alone, 2 replicas on one
instance, and the job holds there (``DIR/hold``) until Slurm has declared n2 down: with
``--no-kill`` the allocation outlives its node, and the job ends well, with the samples and
weights (rtol 1e-5) of an uninterrupted run of the same cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.support.elastic_logs import samples, weights
from tests.support.jobs import job_env, poprun_argv
from tests.support.slurm_cluster import ROOT, SlurmCluster, unavailable
from tests.support.tiers import require

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PROGRAM = [sys.executable, str(ROOT / "tests" / "bin" / "elastic_train.py")]
ALLOC = ["--no-kill", "-N2", "--ntasks-per-node=1"]
STEPS, FAULT_AFTER = "10", 3
#: The longest any wait here may take (a failed test, not a hang).
PATIENCE_S = 180.0


@pytest.fixture
def own_cluster() -> Iterator[SlurmCluster]:
    """Two nodes of this test's own, a silent node declared down after 5 s."""
    require("Slurm", unavailable(), os.environ.get("CI") == "true" and os.geteuid() == 0)
    made = SlurmCluster(nodes=2, cpus=4, extra=["SlurmdTimeout=5"])
    made.start()
    try:
        yield made
    finally:
        made.stop()


class Job:
    """``salloc ALLOC poprun ...`` in its own session; each output line as it comes."""

    def __init__(self, cluster: SlurmCluster, *args: str) -> None:
        argv = [shutil.which("salloc") or "salloc", *ALLOC, *poprun_argv(*args)]
        self.proc = subprocess.Popen(
            argv, env=cluster.env(job_env()), cwd=ROOT, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        self.lines.extend(self.proc.stdout)

    def wait(self) -> int:
        try:
            code = self.proc.wait(timeout=PATIENCE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        self._reader.join(timeout=10)
        return code

    @property
    def text(self) -> str:
        return "".join(self.lines)


def until(condition: object, job: Job, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():  # type: ignore[operator]
        assert job.proc.poll() is None, f"the job ended before {what}:\n{job.text}"
        assert time.monotonic() < deadline, f"no {what} in {PATIENCE_S:g} s:\n{job.text}"
        time.sleep(0.1)


def test_a_lost_node_is_left_out_and_the_job_goes_on(
    own_cluster: SlurmCluster, tmp_path: Path
) -> None:
    cluster = own_cluster
    launch = ["--num-instances", "2", "--num-replicas", "2"]
    reference = tmp_path / "reference"
    reference.mkdir()
    job = Job(cluster, *launch, *PROGRAM, str(reference), STEPS, "0")
    assert job.wait() == 0, job.text
    lost = tmp_path / "lost"
    lost.mkdir()
    job = Job(cluster, *launch, "--min-hosts", "1", *PROGRAM, str(lost), STEPS, "0.3")
    log = lost / "log" / "1.g0"  # instance 1, on n2
    until(lambda: log.exists() and len(log.read_text().splitlines()) >= FAULT_AFTER, job, "step")
    (lost / "hold").touch()  # the smaller job waits after its first step
    killed = cluster.lose("n2")
    assert len(killed) >= 3, killed  # slurmd, the step daemon, Open MPI's daemon, ...
    until(lambda: (lost / "log" / "0.g1").exists(), job, "step of the smaller job")
    until(lambda: cluster.node_states().get("n2", "").startswith("down"), job, "n2 down")
    assert job.proc.poll() is None, job.text  # the allocation outlived its node (--no-kill)
    (lost / "hold").unlink()
    assert job.wait() == 0, job.text
    assert "poprun: lost host n2 (" in job.text, job.text
    assert "launching the job again on n1 (generation 1)" in job.text, job.text
    assert job.text.count("<stdout>:OK ") == 1, job.text
    assert "hold no lease" not in job.text  # n1, n2 reached through their NodeAddr
    assert samples(lost) == samples(reference)  # none skipped, none repeated
    want = weights(reference)
    got = weights(lost)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-7)
    assert cluster.wait_clean(within=15.0) == []
