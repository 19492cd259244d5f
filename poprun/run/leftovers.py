"""What a job leaves behind: processes its instances started, and Open MPI's session files.

poprun makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process whose parent
dies (an instance's background child, a daemon that called ``setsid``) is re-parented to
poprun instead of init. So, once mpirun has gone or every instance has exited, everything
under poprun other than mpirun is something the job left behind: poprun finds it by pid
in ``/proc``, kills it by pid and reaps it, and reports it. Nothing is ever killed by name.

If poprun has to SIGKILL mpirun, mpirun cannot remove its session directory
(``$TMPDIR/ompi.<host>.<uid>/pid.<mpirun pid>``) nor the shared-memory segments its
instances mapped: :func:`remove_session_files` removes exactly those, by that pid and by the
paths read from the instances' memory maps before they were killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Mapping

PR_SET_CHILD_SUBREAPER = 36
#: Basename prefixes of the shared-memory files Open MPI's transports create.
_SEGMENT_PREFIXES = ("vader_segment.", "sm_segment.")


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process; False where Linux refuses."""
    try:
        import ctypes

        done: int = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        return done == 0
    except (OSError, AttributeError):
        return False


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's), from /proc."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                out.extend(int(c) for c in handle.read().split())
        except OSError:
            continue
    return out


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, or a process gone, does not)."""
    return _state(pid) not in ("", "Z", "X")


def _tree(roots: list[int]) -> list[int]:
    """``roots`` and all their descendants, live ones only (no zombies), parents first."""
    seen: list[int] = []
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen or not alive(pid):
            continue
        seen.append(pid)
        stack.extend(children(pid))
    return seen


def left_behind(keep: set[int]) -> list[int]:
    """Live processes under this one that are not ``keep`` (mpirun) or under it."""
    return _tree([pid for pid in children(os.getpid()) if pid not in keep])


def launch_connection(pid: int) -> bool:
    """Whether ``pid`` is one of mpirun's own connections to a remote daemon (its launch
    agent, ``ssh HOST ... orted ...``): poprun's connection, not something the job left.
    One already gone (no command line: ended, or a zombie) is not left behind either."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().split(b"\0")
    except OSError:
        return True
    if not words[0]:
        return True
    return any(b"orted" in word for word in words[1:]) and b"ssh" in words[0]


def describe(pids: list[int]) -> str:
    """``"1234 (sleep), 1240 (python)"``."""
    names = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as handle:
                names.append(f"{pid} ({handle.read().strip()})")
        except OSError:
            names.append(str(pid))
    return ", ".join(names)


def kill_and_reap(keep: set[int], within: float = 2.0) -> list[int]:
    """SIGKILL, by pid, every process :func:`left_behind` finds; reap those that are ours.

    Repeats until none is left (one may fork while being killed), for at most ``within``
    seconds. Returns every pid it killed.
    """
    killed: list[int] = []
    deadline = time.monotonic() + within
    while True:
        pids = left_behind(keep)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            if pid not in killed:
                killed.append(pid)
        _reap(keep)
        if not pids or time.monotonic() > deadline:
            return killed
        time.sleep(0.01)  # let the kernel re-parent the killed processes' children


def _reap(keep: set[int]) -> None:
    """Collect the exit status of this process's dead children, except ``keep``'s."""
    for pid in children(os.getpid()):
        if pid in keep:
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def segments_of(pid: int) -> set[str]:
    """Paths of Open MPI shared-memory segments ``pid`` has mapped (read before killing it)."""
    found: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps") as handle:
            for line in handle:
                path = line.split(None, 5)[5].strip() if line.count(" ") >= 5 else ""
                if path.endswith(" (deleted)"):
                    continue
                if os.path.basename(path).startswith(_SEGMENT_PREFIXES):
                    found.add(path)
    except (OSError, IndexError):
        pass
    return found


def remove_session_files(mpirun_pid: int, env: Mapping[str, str], segments: set[str]) -> list[str]:
    """Remove a SIGKILLed mpirun's session directory and its instances' segments.

    Only paths named by that pid (or read from the instances' maps) and owned by this user.
    Returns what was removed.
    """
    from pathlib import Path  # only after a SIGKILLed mpirun: not on every launch's path

    removed: list[str] = []
    uid = os.getuid()
    base = Path(env.get("TMPDIR") or tempfile.gettempdir())
    host = socket.gethostname().split(".", 1)[0]
    for top in {base / f"ompi.{host}.{uid}", base / f"ompi.{socket.gethostname()}.{uid}"}:
        session = top / f"pid.{mpirun_pid}"
        with contextlib.suppress(OSError):
            if session.is_dir() and session.stat().st_uid == uid:
                shutil.rmtree(session, ignore_errors=True)
                removed.append(str(session))
        with contextlib.suppress(OSError):
            top.rmdir()  # only if empty: another job's session may live there
            removed.append(str(top))
    for path in sorted(segments):
        with contextlib.suppress(OSError):
            if os.stat(path).st_uid == uid:
                os.unlink(path)
                removed.append(path)
    return removed


#: The prefixes of poprun's private directories: its FIFOs' and its ssh masters'.
PRIVATE_PREFIXES = ("poprun-output-", "poprun-ssh-")


#: The locks poprun holds on its own private directories, open until it exits.
_HELD: list[int] = []


def private_dir(prefix: str) -> str:
    """A new private directory ``$TMPDIR/<prefix><poprun's pid>-<random>``, locked
    (``flock``) for as long as this poprun runs.

    A poprun killed by SIGKILL cannot remove its directories; the next poprun of the same
    user does: first it removes every ``<one of PRIVATE_PREFIXES><pid>-*`` directory it owns
    whose pid no longer runs and whose lock nobody holds (a pid that runs again as another
    process keeps its directory: nothing of a live process is touched). The lock is what
    counts across PID namespaces: a poprun in a container of its own (a pod's PID 1) that
    shares ``/tmp`` sees none of the others' pids, and took their live directories for dead
    (an ssh master's socket directory went from under a running check).
    """
    assert prefix in PRIVATE_PREFIXES, prefix
    base = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            pid = _owner_pid(entry)
            if pid is not None and not alive(pid) and not _locked(entry.path):
                shutil.rmtree(entry.path, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=base)
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)  # not inherited (close-on-exec)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _HELD.append(fd)
    return path


def _locked(path: str) -> bool:
    """Whether a live process (of any PID namespace) holds ``path``'s lock."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing it lets go of a lock it took
    return False


def _owner_pid(entry: os.DirEntry[str]) -> int | None:
    """The pid in a ``<prefix><pid>-*`` directory of poprun's of this user's, else None."""
    prefix = next((p for p in PRIVATE_PREFIXES if entry.name.startswith(p)), None)
    if prefix is None:
        return None
    digits = entry.name[len(prefix) :].partition("-")[0]
    try:
        if not digits.isdigit() or not entry.is_dir(follow_symlinks=False):
            return None
        if entry.stat(follow_symlinks=False).st_uid != os.getuid():
            return None
    except OSError:
        return None
    return int(digits)
