"""Issue 27 across hosts: the hang and desync verdicts name a remote instance and its host.

Two instances on namespace hosts h1 and h2 (``hosts.py``), poprun started on h1; instance 1,
on h2, is the odd one: it blocks in a function of its own (``tests/bin/hang.py sleep``:
``stall_here``) before the allreduce instance 0 waits in, or sums one metric more
(``tests/bin/desync_metric.py``). Its progress records, and the stack in them, reach poprun
over ssh through mpirun's forwarded stderr. After each test no process of the job may be
left on any host (``clean_hosts``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.multihost.hosts import Hosts
from tests.support.jobs import ROOT, job_env, poprun_argv, run_job

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

HANG = str(ROOT / "tests" / "bin" / "hang.py")


def poprun_on(hosts: Hosts, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``poprun ARGS`` started on h1, run to its end (stdout and stderr merged)."""
    argv = hosts.on("h1", poprun_argv(*args), cwd=str(ROOT))
    return run_job(argv, env=hosts.env(job_env()), timeout=timeout)


def test_a_remote_instance_blocked_in_its_own_function_is_named(clean_hosts: Hosts) -> None:
    done = poprun_on(
        clean_hosts,
        "--num-instances", "2", "--num-replicas", "2", "-H", "h1,h2", "--hang-timeout", "10",
        sys.executable, HANG, "sleep",
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 124, out
    assert "poprun: the job is hung: no instance has made progress for 10 s" in out
    lines = out.splitlines()
    waiting = next(line for line in lines if line.startswith("poprun: instance 0 (host h1, pid"))
    assert "waits in collective #2 allreduce 'after.stall' (3,) float32" in waiting, waiting
    assert "hang.py:" in waiting and " in main" in waiting, waiting
    missing = next(line for line in lines if line.startswith("poprun: instance 1 (host h2, pid"))
    assert "is missing: it is in no collective" in missing, missing
    frames = out[out.index(missing) :]
    assert ", in stall_here" in frames and "time.sleep(seconds)" in frames  # where it is, on h2
    assert out.rstrip().endswith("poprun: ended the job; exit code 124")


def test_a_remote_desync_names_both_calls_and_hosts(clean_hosts: Hosts) -> None:
    """Instance 1, on h2, sums one metric more than instance 0 (Horovod, the default)."""
    done = poprun_on(
        clean_hosts,
        "--num-instances", "2", "--num-replicas", "2", "-H", "h1,h2",
        sys.executable, str(ROOT / "tests" / "bin" / "desync_metric.py"),
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 1, out
    assert "poprun: the instances are out of step" in out
    for instance, host, shape in ((0, "h1", "(2,)"), (1, "h2", "(3,)")):
        head = f"poprun:   instance {instance} (host {host}): allreduce 'metrics' shape {shape}"
        line = next((text for text in out.splitlines() if text.startswith(head)), out)
        assert "desync_metric.py:" in line and " in sum_metrics" in line, line
    assert "instance 0 done" not in out and "instance 1 done" not in out  # none went on
