"""Instances on this host write straight to poprun, through one FIFO per stream.

mpirun forwards its instances' output through its own event loop, in pieces of at most
4 KiB, each tagged ``[1,rank]<stdout>:``; on one core that loop tops out near 100 MB/s, and
poprun then has to undo the framing. An instance on poprun's own host needs none of that:
its wrapper (:data:`poprun.plan.mpirun.WRAPPER`) points its stdout and stderr at two FIFOs poprun
made in a private directory, named by :data:`ENV`. Only mpirun's local children inherit that
variable (poprun never forwards it with ``-x``), so instances on other hosts keep mpirun's
forwarding, and the wrapper falls back to it wherever the FIFOs are missing. The bytes read
from a FIFO are the instance's own: nothing to demultiplex.

A FIFO that no instance opened reports nothing to ``epoll``, and a non-blocking read of it
returns end of file (no writer): :meth:`Supervisor <poprun.run.supervisor.Supervisor>` reads
every FIFO once when mpirun has exited, so one whose wrapper never ran is closed there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Iterable

from poprun.run import leftovers

#: The environment variable with the FIFOs' directory (``<dir>/<instance>.<stdout|stderr>``).
ENV = "POPRUN_DIRECT_OUTPUT"
#: A pipe's capacity while poprun reads it (Linux's default is 64 KiB): a burst of output
#: waits in the kernel instead of stalling its writer while poprun is busy.
PIPE_BYTES = 1 << 20


def enlarge_pipe(fd: int) -> None:
    """Raise the capacity of the pipe or FIFO ``fd`` to :data:`PIPE_BYTES` where allowed."""
    with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size, or not Linux
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _undelivered(instance: int, kind: str, data: bytes) -> None:
    raise RuntimeError(f"instance {instance}'s {kind} FIFO has no reader (deliver_to)")


class DirectFeed:
    """One instance's stdout or stderr FIFO: its bytes go to ``on_instance`` as they are."""

    __slots__ = ("instance", "kind", "on_instance")

    def __init__(
        self, instance: int, kind: str, on_instance: Callable[[int, str, bytes], None]
    ) -> None:
        self.instance = instance
        self.kind = kind
        self.on_instance = on_instance

    def feed(self, data: bytes) -> None:
        self.on_instance(self.instance, self.kind, data)

    def close(self) -> None:
        """End of file: nothing held back (the instance stream keeps any open line)."""


class DirectOutput:
    """The FIFOs of this host's instances, open for reading before mpirun starts."""

    def __init__(
        self,
        instances: Iterable[int],
        on_instance: Callable[[int, str, bytes], None] = _undelivered,
    ):
        self.directory = leftovers.private_dir("poprun-output-")
        #: Read end (non-blocking) -> its feed; an fd leaves when :meth:`close_fd` closes it.
        self.feeds: dict[int, DirectFeed] = {}
        try:
            for instance in instances:
                for kind in ("stdout", "stderr"):
                    path = os.path.join(self.directory, f"{instance}.{kind}")
                    os.mkfifo(path, 0o600)
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                    enlarge_pipe(fd)
                    self.feeds[fd] = DirectFeed(instance, kind, on_instance)
        except OSError:
            self.close()
            raise

    def deliver_to(self, on_instance: Callable[[int, str, bytes], None]) -> None:
        """Where the FIFOs' bytes go, once the reader exists (made after the FIFOs)."""
        for feed in self.feeds.values():
            feed.on_instance = on_instance

    def env(self) -> dict[str, str]:
        """What mpirun's environment gets (its local children inherit it)."""
        return {ENV: self.directory} if self.feeds else {}

    def close_fd(self, fd: int) -> None:
        """Close one FIFO (end of file, or given up on)."""
        if self.feeds.pop(fd, None) is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every FIFO and remove the directory."""
        for fd in list(self.feeds):
            self.close_fd(fd)
        shutil.rmtree(self.directory, ignore_errors=True)
