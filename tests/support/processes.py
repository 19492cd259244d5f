"""The test process's children, read from /proc: who is still running, and reaping them.

The suite's pytest process is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a
process a test started in its own session, and orphaned since, is re-parented to it and is
still seen as a descendant when the test ends (``tests/conftest.py`` fails a test that
leaves one).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

#: The suite's own long-lived daemons in this process (the multi-host tier's sshds, the Slurm
#: tier's slurmctld and slurmd), started by session fixtures and ended at the session's end:
#: they and what runs under them are the harness, never a test's leftovers
#: (:func:`descendants` with ``besides_harness``).
HARNESS_DAEMONS: set[int] = set()


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def end_with_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """In a child before ``exec`` (``preexec_fn``): get ``signum`` when ``parent`` dies.

    Linux ``PR_SET_PDEATHSIG``; it survives ``exec`` of ordinary binaries. A parent that died
    before the call is caught by comparing ``getppid``.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


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


def descendants(pid: int | None = None, *, besides_harness: bool = False) -> list[int]:
    """Every live (non-zombie) descendant of ``pid`` (default: this process); with
    ``besides_harness``, leaving out :data:`HARNESS_DAEMONS` and everything under them."""
    root = os.getpid() if pid is None else pid
    skip = HARNESS_DAEMONS if besides_harness else set()
    seen: list[int] = []
    stack = _children(root)
    while stack:
        child = stack.pop()
        if child in seen or child in skip:
            continue
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            seen.append(child)
        stack.extend(_children(child))
    return seen


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return "?"


def reap_children() -> None:
    """Collect every exited child of this process (without blocking)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_in_session(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end in a session of its own, stdout and stderr merged; past
    ``timeout`` its process group is killed (by id) and :class:`TimeoutError` raised with
    the end of its output."""
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise TimeoutError(f"{argv[0]} outlived {timeout} s:\n{out[-4000:]}") from None
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, None)


def kill_harness(module: str, within: float) -> tuple[list[str], list[int]]:
    """``python -m MODULE up`` (a cluster harness: Slurm's, Grid Engine's) killed outright
    once it printed its ``daemons: PID...`` line: (what it printed, the daemons still alive
    ``within`` seconds later, watched through pidfds, readable once a process exits). The
    caller removes what the killed harness left on disk."""
    import select
    import sys
    import time

    up = subprocess.Popen(
        [sys.executable, "-m", module, "up"],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert up.stdout is not None
    said = []
    for line in up.stdout:
        said.append(line)
        if line.startswith("daemons:"):
            break
    daemons = [int(word) for word in said[-1].split()[1:]] if said else []
    assert len(daemons) == 3, f"{module} did not come up: {''.join(said)}"
    watch = {os.pidfd_open(pid): pid for pid in daemons}
    os.kill(up.pid, signal.SIGKILL)
    up.wait()
    up.stdout.close()
    try:
        waiting = select.poll()
        for fd in watch:
            waiting.register(fd, select.POLLIN)
        ended: set[int] = set()
        deadline = time.monotonic() + within
        while len(ended) < len(watch) and (left := deadline - time.monotonic()) > 0:
            for fd, _ in waiting.poll(left * 1000):
                ended.add(fd)
                waiting.unregister(fd)
        return said, [pid for fd, pid in watch.items() if fd not in ended]
    finally:
        for fd in watch:
            os.close(fd)
