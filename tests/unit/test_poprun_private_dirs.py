"""poprun's private directories (FIFOs, ssh masters) outlive a SIGKILLed poprun only until
the next poprun of the same user, which removes those whose poprun is gone."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import pytest

from poprun.run import leftovers

pytestmark = pytest.mark.unit


def _a_pid_nobody_has() -> int:
    """A pid no process has now (read from /proc; no process is started for it)."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(pid for pid in range(pid_max - 1, 300, -1) if not Path(f"/proc/{pid}").exists())


def test_a_dead_popruns_directory_is_removed_and_a_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead_pid = _a_pid_nobody_has()
    dead = tmp_path / f"poprun-output-{dead_pid}-abc"
    live = tmp_path / f"poprun-output-{os.getppid()}-def"  # pytest's parent runs
    other = tmp_path / "poprun-output-notapid"
    for path in (dead, live, other):
        path.mkdir()
        (path / "0.stdout").touch()
    made = Path(leftovers.private_dir("poprun-output-"))
    assert not dead.exists()
    assert live.exists() and other.exists()
    assert made.parent == tmp_path and made.name.startswith(f"poprun-output-{os.getpid()}-")
    assert made.stat().st_mode & 0o777 == 0o700
    # the other kind of poprun directory is swept too (a run may make only one kind)
    stale_ssh = tmp_path / f"poprun-ssh-{dead_pid}-x"
    stale_ssh.mkdir()
    leftovers.private_dir("poprun-output-")
    assert not stale_ssh.exists()


def test_a_locked_directory_is_kept_whatever_its_pid_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poprun in a container of its own (a pod's PID 1) shares /tmp but none of the pids:
    another namespace's live poprun holds its directory's lock, and its directory stays."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    theirs = tmp_path / f"poprun-ssh-{_a_pid_nobody_has()}-abc"  # its pid means nothing here
    theirs.mkdir()
    fd = os.open(theirs, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as that poprun holds it
        made = leftovers.private_dir("poprun-ssh-")
        assert theirs.exists()
        # this poprun's own directory is locked too: another poprun keeps it
        probe = os.open(made, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(probe)
    finally:
        os.close(fd)
    leftovers.private_dir("poprun-ssh-")  # the lock gone with its process: removed
    assert not theirs.exists()
