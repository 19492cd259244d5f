"""A start gate for many light instances (``tests/bin/gathered.sh``): the caller learns when
every instance has started, then releases them all at once.

Two FIFOs in a directory: each instance writes one byte to ``started``, and waits on ``go``
for end of file. The gate holds both open read-write, so no instance blocks opening them and
no end of file comes before :meth:`Gate.release` closes ``go``. Besides timing "every
instance has started", it keeps a job of short-lived instances from ending while mpirun is
still starting the others: Open MPI 4.1 then misses a child's exit now and again and waits
for ever (seen with 32 bare ``mpirun`` instances of ``/bin/true`` on 2 busy cores).
"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path


class Gate:
    """The two FIFOs in ``directory``, held open; :meth:`close` when done."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        for name in ("started", "go"):
            os.mkfifo(directory / name, 0o600)
        self._started = os.open(directory / "started", os.O_RDWR | os.O_NONBLOCK)
        self._go: int | None = os.open(directory / "go", os.O_RDWR)
        self.count = 0

    def wait_started(self, instances: int, timeout: float) -> float | None:
        """Block until ``instances`` bytes have arrived; the time of the last (monotonic), or
        None when ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        while self.count < instances:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._started], [], [], left)[0]:
                return None
            try:
                self.count += len(os.read(self._started, instances - self.count))
            except BlockingIOError:
                continue
        return time.monotonic()

    def release(self) -> None:
        """Every instance's ``read`` of ``go`` ends now."""
        if self._go is not None:
            os.close(self._go)
            self._go = None

    def close(self) -> None:
        self.release()
        os.close(self._started)
