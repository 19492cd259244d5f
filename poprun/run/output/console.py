"""poprun's own standard streams, as a well-kept command-line tool treats them.

- Closed at start (``>&-``, ``2>&-``, a daemon or cron without them): not an error.
  :func:`install` puts ``/dev/null`` in the gap before anything else runs, so poprun,
  mpirun and the instances write into it, and the job runs as usual (the files of
  ``--output-dir`` still get everything).
- Closed by the reader during the run (``poprun ... | head -1``): from the first failed
  write on, that stream goes to ``/dev/null``, quietly (no ``BrokenPipeError``, at any
  layer). The job runs on to its end and poprun exits with the job's code: a training run
  is not ended because a pager was closed.
"""

from __future__ import annotations

import errno
import io
import os
import sys

#: Errors that mean "nobody reads this stream any more".
_GONE = (errno.EPIPE, errno.EBADF, errno.ECONNRESET)


def _null_over(fd: int) -> None:
    """Make ``fd`` write to ``/dev/null`` from now on."""
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


class QuietFd(io.RawIOBase):
    """A raw writer on a file descriptor that turns into ``/dev/null`` when its reader goes."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        #: The reader went away during the run (the rest was dropped).
        self.reader_gone = False

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data)
        size = len(view)
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except InterruptedError:
                continue
            except OSError as error:
                if error.errno not in _GONE:
                    raise
                self.reader_gone = True
                _null_over(self._fd)
                break
        return size


def install() -> None:
    """Fill closed fds 0-2 with ``/dev/null``; make ``sys.stdout``/``sys.stderr`` quiet writers.

    Called once by the ``poprun`` command before anything else (not by in-process callers).
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _null_over(fd)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        encoding = getattr(old, "encoding", None) or "utf-8"
        buffered = io.BufferedWriter(QuietFd(fd), 1 << 16)  # type: ignore[type-var]
        setattr(
            sys,
            name,
            io.TextIOWrapper(
                buffered, encoding=encoding, errors="backslashreplace", line_buffering=fd == 2
            ),
        )
