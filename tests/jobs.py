"""Running a whole job (poprun or mpirun) from a test.

A job runs in its own session with a clean environment (none of the launcher variables:
the job must get them from its launcher), stdout and stderr merged, and if it outlives its
time its whole process group is killed (ours only, never by name) and the test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPIRUN = shutil.which("mpirun")
LAUNCHER_PREFIXES = ("POPDIST_", "OMPI_", "PMIX_", "HOROVOD_")


def job_env(**extra: str) -> dict[str, str]:
    """This environment minus every launcher variable, with the project importable."""
    out = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    out.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    out.update(extra)
    return out


def poprun_argv(*args: str) -> list[str]:
    """``poprun ARGS`` with this interpreter."""
    return [sys.executable, "-m", "poprun", *args]


def mpirun_argv(np: int, *args: str) -> list[str]:
    """Bare ``mpirun -np N ARGS`` with the flags this machine needs."""
    if MPIRUN is None:
        pytest.skip("mpirun not installed (make setup installs Open MPI)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [MPIRUN, *root, "--oversubscribe", "--bind-to", "none", "-np", str(np), *args]


def run_job(
    argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end; on time-out kill its process group and fail the test."""
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=job_env() if env is None else env,
        stdin=subprocess.DEVNULL,
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
        pytest.fail(f"{argv[0]} outlived {timeout} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, None)


def run_mpi(
    np: int,
    args: list[str],
    *,
    timeout: float = 240,
    backend: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``mpirun -np N python ARGS`` as a job; ``backend`` goes in ``POPDIST_BACKEND``."""
    extra = dict(env or {})
    if backend is not None:
        extra["POPDIST_BACKEND"] = backend
    env = job_env(**extra)
    return run_job(mpirun_argv(np, sys.executable, *args), env=env, timeout=timeout)
