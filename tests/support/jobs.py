"""Running a whole job (poprun or mpirun) from a test.

A job runs in its own session with a clean environment (none of the launcher variables:
the job must get them from its launcher), stdout and stderr merged, and if it outlives its
time its whole process group is killed (ours only, never by name) and the test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import cmdline, run_in_session

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = shutil.which("mpirun")
LAUNCHER_PREFIXES = ("POPDIST_", "OMPI_", "PMIX_", "HOROVOD_", "SLURM_")


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
    try:
        return run_in_session(
            argv, env=job_env() if env is None else env, cwd=ROOT, timeout=timeout
        )
    except TimeoutError as error:
        pytest.fail(str(error))


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


# --- poprun as a process: shared by the launch tier's test modules ---------------------------


def run_poprun(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``poprun ARGS`` to its end (this environment plus ``env``); stdout and stderr apart,
    decoded without newline translation (keeps ``\\r``)."""
    raw = subprocess.run(
        poprun_argv(*args),
        capture_output=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        cwd=ROOT,
    )
    return subprocess.CompletedProcess(
        raw.args, raw.returncode, raw.stdout.decode(), raw.stderr.decode()
    )


def start_poprun(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``poprun ARGS`` started in its own session, stdout and stderr piped (text)."""
    return subprocess.Popen(
        poprun_argv(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        start_new_session=True,
    )


def wait_for_line(stream: object, needle: str, count: int = 1) -> None:
    """Read ``stream`` until ``needle`` has appeared in ``count`` lines."""
    seen = 0
    for line in stream:  # type: ignore[attr-defined]
        if needle in line:
            seen += 1
            if seen == count:
                return
    raise AssertionError(f"{needle!r} never appeared")


def assert_no_descendants(within: float = 5.0) -> None:
    """No live descendant of this process is left (reaping any zombie child meanwhile),
    besides the harness's own daemons (``HARNESS_DAEMONS``: the multi-host tier's sshds, the
    Slurm cluster's daemons, alive for the session wherever a worker ran those tiers first)."""
    import contextlib
    import time

    from tests.support.processes import descendants

    deadline = time.monotonic() + within
    while descendants(besides_harness=True) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)
        time.sleep(0.05)
    left = descendants(besides_harness=True)
    assert left == [], [f"{pid}: {cmdline(pid)}" for pid in left]
