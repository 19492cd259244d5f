"""Issue 27: poprun names the instance that holds the job up, and where it is.

Real poprun → real mpirun → ``tests/bin/hang.py``, two instances; instance 1 is the odd one
out. The verdicts come from the instances' progress records (``popdist.progress``); the
time-outs are the issue's (``--hang-timeout 10``), or scaled down where a test only waits.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest

from tests.support.jobs import assert_no_descendants, wait_for_line
from tests.support.jobs import run_poprun as poprun
from tests.support.jobs import start_poprun as start

pytestmark = pytest.mark.launch

TWO = ("--num-replicas", "2", "--num-instances", "2")
SCRIPT = ("tests/bin/hang.py",)


def test_an_instance_blocked_in_its_own_function_is_named_with_its_frame() -> None:
    done = poprun(*TWO, "--hang-timeout", "10", sys.executable, *SCRIPT, "sleep", timeout=90)
    assert done.returncode == 124, done.stderr
    err = done.stderr
    assert "poprun: the job is hung: no instance has made progress for 10 s" in err
    assert "instance 0 (host localhost" in err
    assert "waits in collective #2 allreduce 'after.stall'" in err  # what instance 0 waits in
    assert "instance 1 (host localhost" in err and "is missing" in err
    assert ", in stall_here" in err and "time.sleep(seconds)" in err  # where instance 1 is
    assert err.rstrip().endswith("poprun: ended the job; exit code 124")
    assert_no_descendants()


def test_a_dead_lock_in_one_instance_while_the_other_waits_in_the_gradient_allreduce() -> None:
    done = poprun(*TWO, "--hang-timeout", "8", sys.executable, *SCRIPT, "lock", timeout=90)
    assert done.returncode == 124, done.stderr
    err = done.stderr
    assert "allreduce 'popdist_torch.grad." in err  # instance 0 waits in a gradient reduction
    assert "instance 1 (host localhost" in err and "is missing" in err
    assert ", in take_lock_twice" in err and "lock.acquire()" in err
    assert_no_descendants()


def test_on_hang_report_keeps_the_job_running() -> None:
    done = poprun(
        *TWO, "--hang-timeout", "4", "--on-hang", "report",
        sys.executable, *SCRIPT, "sleep", "9", timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "poprun: the job is hung" in done.stderr and "stall_here" in done.stderr
    assert "poprun: the job goes on (--on-hang=report)" in done.stderr
    assert done.stdout.count("done") == 2


def test_different_shapes_at_one_step_end_the_job_with_both_sites_named() -> None:
    done = poprun(*TWO, "--backend", "torch", sys.executable, *SCRIPT, "desync", timeout=90)
    assert done.returncode == 1, done.stderr
    err = done.stderr
    assert "poprun: the instances are out of step" in err
    for instance, width, elements in ((0, "8", "49"), (1, "16", "97")):
        head = f"poprun:   instance {instance} "
        line = next(text for text in err.splitlines() if text.startswith(head))
        shape = line.split(" shape ")[1].split(" float32")[0]
        # The gradients of an update are one flat group (popdist.progress.Group), as is the
        # parameters' broadcast that instance 1 may report before it runs past it: 49
        # elements against 97. (A layer's own shape, (1, 8) or (8, 4), if a backend's error
        # names a single tensor.)
        assert width in shape.strip("()").split(", ") or shape == f"({elements},)", line
        assert "called at " in line and "hang.py" in line, line
    assert_no_descendants()


@pytest.mark.parametrize(("alone", "hang_timeout"), [(7, 10), (20, 30)])
def test_a_long_evaluation_on_one_instance_is_no_hang(alone: int, hang_timeout: int) -> None:
    done = poprun(
        *TWO, "--hang-timeout", str(hang_timeout),
        sys.executable, *SCRIPT, "evaluate", str(alone), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "the job is hung" not in done.stderr
    assert done.stdout.count("done") == 2
    notes = [line for line in done.stderr.splitlines() if line.startswith("poprun: note:")]
    assert len(notes) <= 1 and all("for instance 1 " in note for note in notes), notes


def test_a_job_stopped_with_ctrl_z_is_not_hung() -> None:
    proc = start(*TWO, "--hang-timeout", "4", sys.executable, *SCRIPT, "train", "0.3")
    assert proc.stdout is not None and proc.stderr is not None
    try:
        wait_for_line(proc.stdout, "step 1", count=2)  # both instances made progress
        proc.send_signal(signal.SIGTSTP)
        time.sleep(7)  # stopped past the hang time-out: the time passing is the test
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            import os

            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err
    assert "the job is hung" not in err
    assert out.count("done") == 2
    assert_no_descendants()
