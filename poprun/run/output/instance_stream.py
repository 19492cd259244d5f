"""One instance's stdout or stderr: cut into lines, prefixed, filtered, saved, its tail kept.

:class:`LineSplitter` cuts an instance's bytes into lines at ``\\n`` and ``\\r`` (bytes, so
a UTF-8 character split across writes is never cut: neither byte occurs inside one);
:class:`InstanceStream` gives the console PopRun's prefix ``[1,<instance>]<stdout>:`` on
every line, copies the bytes to ``--output-dir``, keeps the stderr tail for the failure
report and takes out three kinds of data lines: the instance's pid (its first line), its
structured error record, its progress records (:mod:`popdist.progress`) and, from an instance
on another host, its exit status (its wrapper's last line, :data:`~poprun.plan.mpirun.EXIT_MARKER`).
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from typing import BinaryIO

from popdist.error_record import MARKER
from popdist.progress import MARKER as PROGRESS
from poprun.plan.mpirun import EXIT_MARKER, PID_MARKER

_TRACEBACK = b"Traceback (most recent call last):"
#: How many of an instance's last stderr lines the failure report quotes...
TAIL_LINES = 20
#: ... and at most how many bytes of each (the end of a longer line).
TAIL_LINE_BYTES = 4096
#: A line longer than this goes to the console in pieces as it arrives (the first with the
#: prefix), as mpirun forwards it: poprun's memory stays bounded whatever the program writes.
OPEN_LINE_BYTES = 1 << 16
RECORD_MARKER = MARKER.encode()
PROGRESS_MARKER = PROGRESS.encode()
#: What the error record's and the exit status's markers start with (one search per chunk).
DATA_MARKER = b"\x1fpop"


def prefix(instance: int, kind: str) -> bytes:
    """PopRun's per-line prefix, e.g. ``[1,3]<stderr>:``."""
    return f"[1,{instance}]<{kind}>:".encode()


class LineSplitter:
    """Cut a byte stream into lines ending in ``\\n``, ``\\r\\n`` or ``\\r``.

    Linear in the bytes fed: each chunk is searched once (in C, by ``bytes.rfind`` and
    ``bytes.splitlines``) and a line still open is kept as a list of pieces, never rescanned.
    """

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        #: The open line ended in ``\\r``: it may be the first half of ``\\r\\n``.
        self._cr = False

    def feed(self, data: bytes) -> list[bytes]:
        """Complete lines (with their terminators) now available."""
        return self.feed_text(data).splitlines(keepends=True)  # bytes: only \n, \r\n, \r

    def feed_text(self, data: bytes) -> bytes:
        """The complete lines now available, as one block (empty if none)."""
        if not data:
            return b""
        head = b""
        if self._cr:
            self._cr = False
            crlf = data[:1] == b"\n"
            self._parts.append(b"\r\n" if crlf else b"\r")
            head = b"".join(self._parts)
            self._parts = []
            if crlf:
                data = data[1:]
        end = len(data)
        if data.endswith(b"\r"):
            end -= 1  # a trailing \r is held back until the next byte shows what it ends
            self._cr = True
        cut = max(data.rfind(b"\n", 0, end), data.rfind(b"\r", 0, end)) + 1
        if cut == 0:
            if end:
                self._parts.append(data[:end])
            return head
        if self._parts:
            self._parts.append(data[:cut])
            head += b"".join(self._parts)
            complete = head
        else:
            complete = head + data[:cut] if head else (data if cut == len(data) else data[:cut])
        self._parts = [data[cut:end]] if cut < end else []
        return complete

    def take_open(self, limit: int) -> bytes:
        """The open line so far if it holds more than ``limit`` bytes (it is then consumed).

        A line that never ends must not be held whole: the caller writes it out in pieces.
        """
        if len(self._parts) > 1 or (self._parts and len(self._parts[0]) > limit):
            size = sum(len(part) for part in self._parts)
            if size > limit:
                text = b"".join(self._parts)
                self._parts = []
                return text
            if len(self._parts) > 64:
                self._parts = [b"".join(self._parts)]
        return b""

    def pending(self) -> bytes:
        """The open line (no terminator yet), without consuming it."""
        return b"".join(self._parts) + (b"\r" if self._cr else b"")

    def flush(self) -> bytes:
        """Whatever is left (a last line without a terminator)."""
        rest = self.pending()
        self._parts, self._cr = [], False
        return rest


class InstanceStream:
    """One instance's stdout or stderr: pid marker, error records, file copy, console, tail.

    ``on_record`` is called with each structured error record line (``popdist.error_record``),
    which is then neither shown, nor kept in the tail, nor written to the file; ``on_exit``
    with the exit status line of an instance on another host, and ``on_progress`` with each
    progress record line (``popdist.progress``), both taken out likewise.
    """

    def __init__(
        self,
        instance: int,
        kind: str,
        console: BinaryIO | None,
        file: BinaryIO | None = None,
        on_pid: Callable[[int, int], None] | None = None,
        on_record: Callable[[int, bytes], None] | None = None,
        on_exit: Callable[[int, bytes], None] | None = None,
        on_progress: Callable[[int, bytes], None] | None = None,
    ) -> None:
        self.instance, self.kind, self.console, self.file = instance, kind, console, file
        self.on_pid, self.on_record, self.on_exit = on_pid, on_record, on_exit
        self.on_progress = on_progress
        self.splitter = LineSplitter()
        self.tail: collections.deque[bytes] = collections.deque(maxlen=TAIL_LINES)
        self._marker_pending: bytes | None = b"" if on_pid is not None else None
        #: When this stream first showed a Python traceback (monotonic seconds), if ever.
        self.traceback_at: float | None = None
        #: The console already has the start of the open line (see :data:`OPEN_LINE_BYTES`).
        self._mid_line = False

    def feed(self, data: bytes) -> None:
        """Route a chunk of this instance's bytes."""
        if self._marker_pending is not None:
            data = self._strip_marker(data)
            if not data:
                return
        text = self.splitter.feed_text(data)
        if text:
            self._emit(text)
        part = self.splitter.take_open(OPEN_LINE_BYTES)
        if part:
            if self.file is not None:
                self.file.write(part)
            if self.console is not None:
                self.console.write(
                    part if self._mid_line else prefix(self.instance, self.kind) + part
                )
            self._mid_line = True

    def close(self) -> None:
        """End of the run: emit the last partial line with a newline added."""
        if self._marker_pending:
            pending, self._marker_pending = self._marker_pending, None
            self.feed(pending)
        self._marker_pending = None
        rest = self.splitter.flush()
        if rest:
            self._emit(rest + b"\n", raw=rest)
        if self.file is not None:
            self.file.flush()

    def tail_text(self) -> list[str]:
        """The last lines of this stream, decoded for the failure report."""
        lines = [*self.tail]
        pending = self.splitter.pending()
        if pending:
            lines.append(pending)
        return [line.decode("utf-8", "replace").rstrip("\r\n") for line in lines][-TAIL_LINES:]

    def _emit(self, text: bytes, raw: bytes | None = None) -> None:
        """Complete lines: records out, file copy, stderr tail and traceback watch, console.

        ``raw``: what the file gets instead of ``text`` (the last line, without the newline
        added for the console).
        """
        takes = self.on_record or self.on_exit or self.on_progress
        if takes is not None and DATA_MARKER in text:
            text = self._take_data(text)
            if not text:
                return
            raw = None
        if self.file is not None:  # the file keeps the bytes as written
            self.file.write(text if raw is None else raw)
        plain = b"\r" not in text  # every line ends in \n: the common case, done in C
        if self.kind == "stderr":  # what the failure report quotes
            self._watch(text, plain)
        if self.console is None:
            self._mid_line = False
            return
        head = prefix(self.instance, self.kind)
        if plain:
            # Every \n gets the prefix after it, and the last one's is cut off by a view:
            # a flood's bytes are copied once, by the replace.
            if not self._mid_line:
                self.console.write(head)
            out = text.replace(b"\n", b"\n" + head)
            self._mid_line = False
            self.console.write(memoryview(out)[: len(out) - len(head)])
            return
        else:
            # A bare carriage return (progress bars start with one) needs no prefix.
            out = b"".join(
                line if line == b"\r" or (i == 0 and self._mid_line) else head + line
                for i, line in enumerate(text.splitlines(keepends=True))
            )
        self._mid_line = False
        self.console.write(out)

    def _watch(self, text: bytes, plain: bool) -> None:
        """Keep the last lines for the failure report; note when a traceback starts."""
        if plain:
            start = len(text) - 1
            for _ in range(TAIL_LINES):
                start = text.rfind(b"\n", 0, start)
                if start < 0:
                    break
            lines = text[start + 1 :].splitlines(keepends=True)
        else:
            lines = [
                line
                for line in text.splitlines(keepends=True)
                if line.endswith(b"\n") or not line.endswith(b"\r")
            ]
        if max(map(len, lines), default=0) > TAIL_LINE_BYTES:
            lines = [line[-TAIL_LINE_BYTES:] for line in lines]
        self.tail.extend(lines)
        if self.traceback_at is None and (
            text.startswith(_TRACEBACK) or b"\n" + _TRACEBACK in text or b"\r" + _TRACEBACK in text
        ):
            self.traceback_at = time.monotonic()

    def _take_data(self, text: bytes) -> bytes:
        """``text`` less its data lines, each handed to its callback (data, not output).

        The exit status follows the program's last byte: after a last line without a newline
        it ends that line, which keeps its text (with a newline, as at the end of a stream).
        """
        kept = []
        for line in text.splitlines(keepends=True):
            cut = line.find(EXIT_MARKER) if self.on_exit is not None else -1
            if cut < 0 and self.on_progress is not None:  # a record's thread cut a line short
                cut = line.find(PROGRESS_MARKER)
            if cut > 0:
                kept.append(line[:cut] + b"\n")
                line = line[cut:]
            if line.startswith(PROGRESS_MARKER) and self.on_progress is not None:
                self.on_progress(self.instance, line)
            elif line.startswith(RECORD_MARKER) and self.on_record is not None:
                self.on_record(self.instance, line)
            elif line.startswith(EXIT_MARKER) and self.on_exit is not None:
                self.on_exit(self.instance, line)
            else:
                kept.append(line)
        return b"".join(kept)

    def _strip_marker(self, data: bytes) -> bytes:
        pending = (self._marker_pending or b"") + data
        if len(pending) < len(PID_MARKER) and PID_MARKER.startswith(pending):
            self._marker_pending = pending
            return b""
        if not pending.startswith(PID_MARKER):
            self._marker_pending = None
            return pending
        end = pending.find(b"\n")
        if end < 0:
            self._marker_pending = pending
            return b""
        self._marker_pending = None
        try:
            pid = int(pending[len(PID_MARKER) : end])
        except ValueError:
            return pending
        if self.on_pid is not None:
            self.on_pid(self.instance, pid)
        return pending[end + 1 :]


def open_output_file(directory: str, instance: int, kind: str, *, append: bool = False) -> BinaryIO:
    """``DIR/instance-<i>.<stdout|stderr>``, created with the umask (never world-writable).

    ``append``: a restarted job (``--max-restarts``) adds to the failed attempt's output.
    """
    path = os.path.join(directory, f"instance-{instance}.{kind}")
    keep = os.O_APPEND if append else os.O_TRUNC
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | keep | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb", buffering=0)
