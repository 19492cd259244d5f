"""The unit tier starts no process: logic only, fast, no children to reap.

Every way a test could start one (``subprocess``, ``os.fork``/``posix_spawn``/``exec*``,
``multiprocessing``) raises here with the place to move the test to; tests that need a
process belong to ``tests/launch`` (poprun, mpirun) or ``tests/parallel``.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
from typing import Any, NoReturn

import pytest

from popdist import progress

MOVE = "a unit test starts no process: move it to tests/launch or tests/parallel"


def _font_cache() -> None:
    """matplotlib (Lightning imports it) lists the system fonts with ``fc-list`` the first
    time it is imported on a machine and caches the list; on a fresh machine whose first
    import comes from a unit test that would be refused. Built once here, before any test."""
    try:
        import matplotlib.font_manager  # noqa: F401
    except ImportError:  # not installed: nothing imports it
        return


_font_cache()


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError(f"{what}: {MOVE}")

    return refuse


@pytest.fixture(autouse=True)
def no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting a process fails the test that tried, naming what it called."""
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("subprocess.Popen"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "execvp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"os.{name}"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("multiprocessing"))


@pytest.fixture
def tracker(monkeypatch: pytest.MonkeyPatch) -> progress.Tracker:
    """Progress reporting on, as under poprun, without the reporter thread."""
    t = progress.Tracker()
    monkeypatch.setattr(progress, "tracker", t)
    monkeypatch.setattr(progress, "_reporter", None)
    return t
