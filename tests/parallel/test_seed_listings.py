"""The seed documents' PopTorch and PopDist listings run as their users run them.

Each listing is a script in ``tests/seeds/`` with only its imports changed (``poptorch``
is ``popdist_torch``; torchvision's MNIST is scikit-learn's digits); it is launched the
way its document launches it: plain ``python``, ``mpirun`` or the ``poprun`` command
line the document prints.  A listing that cannot run here fails its test.

The pipelining tutorial, listing 10.1 under plain mpirun and listing 4.2 under poprun run
with their original ``import poptorch`` in ``tests/launch/test_poptorch_unchanged.py``, with
the same checks: as their users run them, so not twice.
"""

from __future__ import annotations

import os
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


def poprun(*args: str) -> list[str]:
    return [str(BIN / "poprun"), *args]


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


def test_horovod_validation_listing() -> None:
    """PopDist guide listing 4.2: torch, poptorch, popdist and Horovod import; hvd.init()."""
    script = str(SEEDS / "listing_popdist_horovod_check.py")
    done = run_job(["python", script], env=user_env())
    assert done.returncode == 0, done.stdout
    assert "Traceback" not in done.stdout
