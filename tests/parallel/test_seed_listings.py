"""The seed documents' PopTorch and PopDist listings run as their users run them.

Each listing is a script in ``tests/seeds/`` with only its imports changed (``poptorch``
is ``popdist_torch``; torchvision's MNIST is scikit-learn's digits); it is launched the
way its document launches it: plain ``python``, ``mpirun`` or the ``poprun`` command
line the document prints.  A listing that cannot run here fails its test.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, job_env, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.slow]

SEEDS = ROOT / "tests" / "seeds"
BIN = Path(sys.executable).parent


def user_env() -> dict[str, str]:
    """A user's shell with the project's virtual environment active (``python`` is it)."""
    env = job_env()
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def mpirun(np: int, *args: str) -> list[str]:
    found = shutil.which("mpirun")
    assert found, "mpirun is not installed: make setup installs Open MPI"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [
        found,
        *root,
        "--oversubscribe",
        "--bind-to",
        "none",
        "--tag-output",
        "-np",
        str(np),
        *args,
    ]


def poprun(*args: str) -> list[str]:
    return [str(BIN / "poprun"), *args]


@pytest.mark.timeout(600)
def test_pipelining_tutorial_trains_and_tests_the_pipelined_model() -> None:
    """Tutorial 2.6: four Block stages, PipelinedExecution over four devices, Async loaders."""
    done = run_job(
        ["python", str(SEEDS / "listing_pipelining_tutorial.py")], env=user_env(), timeout=580
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:]
    for epoch in (1, 2, 3):
        assert f"Epoch {epoch}/3" in out, out[-4000:]
    match = re.search(r"Accuracy on test set: ([0-9.]+)%", out)
    assert match, out[-4000:]
    assert float(match.group(1)) >= 75.0, out[-4000:]


@pytest.mark.timeout(600)
def test_distributed_without_poprun_listing_under_mpirun() -> None:
    """User guide listing 10.1: configureProcessId by hand, launched by plain mpirun.

    100000 samples, combined batch 2 x 400 x 2 x 8 = 12800 per process, two processes:
    each gets its own 50000 samples, so three calls (a process reading the whole dataset
    would make seven).
    """
    done = run_job(
        mpirun(2, "python", str(SEEDS / "listing_distributed_without_poprun.py")),
        env=user_env(),
        timeout=580,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:]
    for rank in (0, 1):
        # Not anchored to a line start: Open MPI ends a rank's unfinished line with the next
        # tag of another rank (the listing prints the newline in a write of its own).
        calls = re.findall(rf"\[1,{rank}\]<stdout>:(\d+) (?:tensor\()?\d+\)?, tensor", out)
        assert calls == ["0", "1", "2"], out[-4000:]


def test_popdist_example_under_the_guides_poprun_command() -> None:
    """PopDist guide listing 4.3 with the guide's own command line (V-IPU flags included)."""
    cmd = poprun(
        "--vipu-partition=MyPartition",
        "--vipu-server-host=127.0.0.1",
        "--num-replicas=4",
        "--num-instances=1",
        "-v",
        "python",
        str(SEEDS / "listing_popdist_pytorch_example.py"),
    )
    done = run_job(cmd, env=user_env())
    assert done.returncode == 0, done.stdout
    lines = [ln for ln in done.stdout.splitlines() if "overridden by PopRun" in ln]
    assert lines == [
        "[1,0]<stdout>:The number of replicas is overridden by PopRun. The new value is 4."
    ]


def test_popdist_example_two_instances_and_without_poprun() -> None:
    """Listing 4.3 on two instances (each initialises Horovod), and run plainly."""
    script = str(SEEDS / "listing_popdist_pytorch_example.py")
    done = run_job(
        poprun("--num-replicas=4", "--num-instances=2", "python", script, "--replicas", "4"),
        env=user_env(),
    )
    assert done.returncode == 0, done.stdout
    assert "overridden" not in done.stdout  # --replicas 4 matches the launch
    plain = run_job(["python", script], env=user_env())
    assert plain.returncode == 0, plain.stdout
    assert plain.stdout.strip() == ""  # outside poprun: no PopDist environment, no message


@pytest.mark.parametrize("launch", ["python", "poprun"])
def test_horovod_validation_listing(launch: str) -> None:
    """PopDist guide listing 4.2: torch, poptorch, popdist and Horovod import; hvd.init()."""
    script = str(SEEDS / "listing_popdist_horovod_check.py")
    argv = ["python", script]
    if launch == "poprun":
        argv = poprun("--num-replicas=2", "--num-instances=2", *argv)
    done = run_job(argv, env=user_env())
    assert done.returncode == 0, done.stdout
    assert "Traceback" not in done.stdout
