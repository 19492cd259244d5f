"""What names a failing instance: its own records, or mpirun's failure boxes.

Three sources name a failing instance. An instance that raised writes its own structured
:class:`ErrorRecord` (:mod:`popdist.error_record`) on its stderr; that answer does not
depend on mpirun's wording and works for remote instances. An instance on another host
ends with an :class:`ExitRecord`, written by its wrapper
(:data:`poprun.plan.mpirun.REMOTE_WRAPPER`): its exit code or signal, whatever mpirun says.
For the rest (a local instance's exit code or signal) mpirun's diagnostics, printed in boxes
of dashes, name the first failing process: :class:`MpirunMessages` reads those and swallows
them. The report built from them (:mod:`poprun.run.verdict`) names the instance, host, pid,
exit code or signal, and then the exception from the record, or else the last lines of that
instance's stderr.
"""

from __future__ import annotations

import json
import re
import signal
from typing import NamedTuple

from popdist.error_record import MARKER
from poprun.plan.mpirun import EXIT_MARKER

_EXIT = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*Exit code:\s*(\d+)", re.S)
_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")
_IMPROPER = re.compile(r"process rank (\d+) with PID \d+ on\s+node \S+ exiting improperly")
_ABORTING = ("Primary job  terminated normally", "Primary job terminated normally")
#: The wrapper's status line after its marker: the status, then when the program ended.
_EXIT_LINE = re.compile(rb"(-?\d{1,3})(?: +(\S*))?")
_SECONDS = re.compile(rb"\d{1,12}(?:\.\d{1,9})?")
#: Open MPI's report from a live process whose peer vanished (help-mpi-btl-tcp.txt).
_PEER_GONE = "peer process has unexpectedly disconnected"
_PEER_HOST = re.compile(r"Peer host:\s*(\S+)")
_BOX = "-" * 20
#: mpirun's echo of a signal it forwards to the job (poprun's save-now notice, SIGUSR1):
#: poprun says so itself, so the echo is not shown.
_FORWARDING = re.compile(r"^\S*mpirun: Forwarding signal \d+ to job$")


class Failure(NamedTuple):
    """The first instance mpirun saw fail."""

    instance: int
    exit_code: int | None = None
    signal: int | None = None
    status_known: bool = True

    @property
    def poprun_exit_code(self) -> int:
        """The code poprun exits with: the instance's own, or 128+N for signal N."""
        if self.signal is not None:
            return 128 + self.signal
        return self.exit_code if self.exit_code is not None else 1

    def describe(self) -> str:
        """``exit code 3`` or ``signal 9 (SIGKILL)``."""
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = "unknown"
            return f"killed by signal {self.signal} ({name})"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}"
        if not self.status_known:
            return "ended first (mpirun was stopped before it reported the exit status)"
        return "exited without finishing MPI (MPI_Finalize not called)"


class ErrorRecord(NamedTuple):
    """An instance's own record of its uncaught exception."""

    type: str
    message: str
    traceback: str
    pid: int | None = None
    host: str | None = None
    instance: int | None = None

    @classmethod
    def from_line(cls, line: bytes) -> ErrorRecord | None:
        """The record a marked stderr line carries; None when ``line`` is not a record."""
        marker = MARKER.encode()
        if not line.startswith(marker):
            return None
        try:
            data = json.loads(line[len(marker) :].decode("utf-8", "replace"))
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return None

        def text(key: str) -> str:
            value = data.get(key)
            return value if isinstance(value, str) else ""

        def number(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(
            type=text("type"),
            message=text("message"),
            traceback=text("traceback"),
            pid=number("pid"),
            host=text("host") or None,
            instance=number("instance"),
        )


class ExitRecord(NamedTuple):
    """How an instance on another host ended, in its wrapper's words (its last stderr line)."""

    #: ``Popen`` style: the exit code, or ``-N`` when signal N killed the program.
    returncode: int
    #: When the wrapper saw the program end (wall-clock seconds on its host), if it said.
    ended_at: float | None = None

    @classmethod
    def from_line(cls, line: bytes) -> ExitRecord | None:
        """The record a marked stderr line carries; None when ``line`` is not a record."""
        if not line.startswith(EXIT_MARKER):
            return None
        match = _EXIT_LINE.fullmatch(line[len(EXIT_MARKER) :].strip())
        if match is None:
            return None
        returncode = int(match.group(1))
        when = match.group(2)  # not a time (a date without %N): the status still counts
        at = float(when) if when and _SECONDS.fullmatch(when) else None
        return cls(returncode, at) if -64 <= returncode <= 255 else None

    @property
    def failed(self) -> bool:
        """Whether the program failed (a non-zero exit code or a signal)."""
        return self.returncode != 0

    @property
    def ended_by_the_job(self) -> bool:
        """Killed by SIGTERM or SIGKILL: what mpirun sends every instance when it ends a job."""
        return -self.returncode in (signal.SIGTERM, signal.SIGKILL)

    def failure(self, instance: int) -> Failure:
        """This ending as the :class:`Failure` of ``instance``."""
        if self.returncode < 0:
            return Failure(instance, signal=-self.returncode)
        return Failure(instance, exit_code=self.returncode)


class MpirunMessages:
    """Collect mpirun's untagged output; recognise failure boxes; pass the rest through."""

    def __init__(self) -> None:
        self.failure: Failure | None = None
        #: The hosts Open MPI's peer reports name as the one whose process vanished, in order.
        self.peers: list[str] = []
        self.aborting = False
        self.other: list[str] = []
        self._box: list[str] | None = None

    def feed_line(self, line: str) -> list[str]:
        """Take one line of mpirun's own text; return lines to show the user now."""
        stripped = line.rstrip("\n")
        if self._box is None:
            if stripped.startswith(_BOX) and set(stripped) == {"-"}:
                self._box = []
                return []
            if self._classify(stripped) or _FORWARDING.match(stripped):
                return []
            self.other.append(stripped)
            return [stripped]
        if stripped.startswith(_BOX) and set(stripped) == {"-"}:
            text = "\n".join(self._box)
            self._box = None
            self._note_peer(text)
            if self._classify(text):
                return []
            self.other.append(text)
            return [_BOX * 3, text, _BOX * 3]
        self._box.append(stripped)
        return []

    def finish(self) -> list[str]:
        """Anything left in an unterminated box."""
        if self._box:
            text = "\n".join(self._box)
            self._box = None
            if not self._classify(text):
                return [text]
        return []

    def _note_peer(self, text: str) -> None:
        """Open MPI's report that a peer vanished: the host it names (the text is shown)."""
        if _PEER_GONE in text:
            match = _PEER_HOST.search(text)
            if match is not None:
                self.peers.append(match.group(1))

    def _classify(self, text: str) -> bool:
        """Record failure information; True when ``text`` is one of mpirun's failure notes."""
        recognised = False
        if any(phrase in text for phrase in _ABORTING):
            self.aborting = True
            recognised = True
        for pattern, kind in ((_EXIT, "exit"), (_SIGNAL, "signal"), (_IMPROPER, "improper")):
            match = pattern.search(text)
            if match is None:
                continue
            recognised = True
            self.aborting = True
            if self.failure is not None:
                continue
            rank = int(match.group(1))
            if kind == "exit":
                self.failure = Failure(rank, exit_code=int(match.group(2)))
            elif kind == "signal":
                self.failure = Failure(rank, signal=int(match.group(2)))
            else:
                self.failure = Failure(rank)
        if "mpirun noticed" in text or "mpirun detected" in text:
            recognised = True
        return recognised
