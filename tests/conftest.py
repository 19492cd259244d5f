"""Suite-wide guards: a test must not leak POPDIST_*/OMPI_* changes or child processes.

The pytest process makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a
process a test started in its own session, and orphaned since, is re-parented here and is
still seen as a descendant when the test ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.multihost.hosts import reap_children

ROOT = Path(__file__).resolve().parent.parent
GUARDED_PREFIXES = ("POPDIST_", "OMPI_", "PMIX_", "HOROVOD_")
PR_SET_CHILD_SUBREAPER = 36
SURVIVOR_GRACE_S = 5.0


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` from /proc (all threads' children files)."""
    out: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def descendants(pid: int | None = None) -> list[int]:
    """Every live (non-zombie) descendant of ``pid`` (default: this process)."""
    root = os.getpid() if pid is None else pid
    seen: list[int] = []
    stack = _children(root)
    while stack:
        child = stack.pop()
        if child in seen:
            continue
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            seen.append(child)
        stack.extend(_children(child))
    return seen


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return "?"


def pytest_configure(config: pytest.Config) -> None:
    _become_subreaper()


TIERS = ("unit", "launch", "parallel", "lightning", "multihost")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under ``CI=true`` a test skipped for want of Horovod fails: CI must have built it."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI", "").lower() != "true" or not report.skipped:
        return
    if "horovod" in str(report.longrepr).lower() and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"CI=true and Horovod is missing: {report.longrepr}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier (its directory), so `-m unit` selects a tier."""
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(autouse=True)
def _no_environment_leak() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if k.startswith(GUARDED_PREFIXES)}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith(GUARDED_PREFIXES)}
    if after != before:
        changed = sorted(set(before.items()) ^ set(after.items()))
        for key in {k for k, _ in changed}:
            if key in before:
                os.environ[key] = before[key]
            else:
                os.environ.pop(key, None)
        pytest.fail(f"test leaked environment changes: {changed}")


@pytest.fixture(autouse=True)
def _no_surviving_children(request: pytest.FixtureRequest) -> Iterator[None]:
    known = set(descendants())
    yield
    deadline = time.monotonic() + SURVIVOR_GRACE_S
    while True:
        reap_children()
        survivors = [p for p in descendants() if p not in known]
        if not survivors or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if survivors:
        described = [f"{p}: {_cmdline(p)}" for p in survivors]
        for pid in survivors:  # by pid only: never a broad name
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reap_children()
        pytest.fail(f"test left child processes running: {described}")
