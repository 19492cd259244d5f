"""Instance output: undo mpirun's ``--tag-output`` framing, re-prefix line by line, filter, save.

mpirun tags each chunk it forwards with ``[job,rank]<stdout>:`` and again after every
``\\n`` inside the chunk, but not at ``\\r`` and not where a line continues in the next
chunk (so partial lines come out as ``[1,0]<stdout>:abc[1,1]...[1,0]<stdout>:def``).
:class:`TagDemux` turns that byte stream back into each instance's own bytes;
:class:`LineSplitter` cuts them into lines at ``\\n`` and ``\\r`` (bytes, so a UTF-8
character split across writes is never cut: neither byte occurs inside one) and the
console gets PopRun's prefix ``[1,<instance>]<stdout>:`` on every line.
"""

from __future__ import annotations

import collections
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from popdist.error_record import MARKER
from poprun.mpirun import PID_MARKER

_TRACEBACK = b"Traceback (most recent call last):"
_TAG = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
_TAG_PREFIX = re.compile(rb"\[\d*(?:,\d*(?:\](?:<[a-z]{0,7}>?)?)?)?")
#: How many of an instance's last stderr lines the failure report quotes.
TAIL_LINES = 20
RECORD_MARKER = MARKER.encode()


def prefix(instance: int, kind: str) -> bytes:
    """PopRun's per-line prefix, e.g. ``[1,3]<stderr>:``."""
    return f"[1,{instance}]<{kind}>:".encode()


def _held_tag_start(buf: bytes) -> int:
    """Index from which ``buf``'s tail could be the start of a tag (``len(buf)`` if none)."""
    start = buf.rfind(b"[", max(0, len(buf) - 32))
    if start >= 0 and _TAG_PREFIX.fullmatch(buf, start):
        return start
    return len(buf)


@dataclass
class TagDemux:
    """Split one of mpirun's tagged output pipes into (rank, kind, bytes) and mpirun's own text."""

    on_instance: Callable[[int, str, bytes], None]
    on_untagged: Callable[[bytes], None]
    _buf: bytes = b""
    _current: tuple[int, str] | None = None  # inside a tagged segment

    def feed(self, data: bytes) -> None:
        """Consume more bytes from the pipe."""
        self._buf += data
        self._drain(final=False)

    def close(self) -> None:
        """End of pipe: release everything held back."""
        self._drain(final=True)
        self._buf = b""

    def _drain(self, *, final: bool) -> None:
        buf = self._buf
        while buf:
            if self._current is None:
                match = _TAG.match(buf)
                if match:
                    kind = "stderr" if match.group(3) != b"stdout" else "stdout"
                    self._current = (int(match.group(2)), kind)
                    buf = buf[match.end() :]
                    continue
                if not final and _TAG_PREFIX.fullmatch(buf):
                    break  # maybe the start of a tag: wait for more
                end = buf.find(b"\n")
                if end < 0:
                    if not final:
                        break
                    end = len(buf) - 1
                self.on_untagged(buf[: end + 1])
                buf = buf[end + 1 :]
                continue
            rank, kind = self._current
            newline = buf.find(b"\n")
            tag = _TAG.search(buf)
            if tag is not None and (newline < 0 or tag.start() <= newline):
                if tag.start():
                    self.on_instance(rank, kind, buf[: tag.start()])
                buf = buf[tag.start() :]
                self._current = None
                continue
            if newline >= 0:
                self.on_instance(rank, kind, buf[: newline + 1])
                buf = buf[newline + 1 :]
                self._current = None
                continue
            keep = len(buf) if final else _held_tag_start(buf)
            if keep:
                self.on_instance(rank, kind, buf[:keep])
            buf = buf[keep:]
            break
        self._buf = buf


@dataclass
class LineSplitter:
    """Cut a byte stream into lines ending in ``\\n``, ``\\r\\n`` or ``\\r``."""

    _buf: bytes = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Complete lines (with their terminators) now available."""
        self._buf += data
        lines: list[bytes] = []
        buf = self._buf
        start = 0
        i = 0
        n = len(buf)
        while i < n:
            byte = buf[i]
            if byte == 0x0A:
                lines.append(buf[start : i + 1])
                start = i + 1
            elif byte == 0x0D:
                if i + 1 == n:
                    break  # a lone trailing \r may be the start of \r\n
                end = i + 2 if buf[i + 1] == 0x0A else i + 1
                lines.append(buf[start:end])
                start = end
                i = end - 1
            i += 1
        self._buf = buf[start:]
        return lines

    def flush(self) -> bytes:
        """Whatever is left (a last line without a terminator)."""
        rest, self._buf = self._buf, b""
        return rest


@dataclass
class InstanceStream:
    """One instance's stdout or stderr: pid marker, error records, file copy, console, tail."""

    instance: int
    kind: str
    console: BinaryIO | None
    file: BinaryIO | None = None
    on_pid: Callable[[int, int], None] | None = None
    #: Called with each structured error record line (``popdist.error_record``), which is
    #: then neither shown, nor kept in the tail, nor written to the file.
    on_record: Callable[[int, bytes], None] | None = None
    splitter: LineSplitter = field(default_factory=LineSplitter)
    tail: collections.deque[bytes] = field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES)
    )
    _marker_pending: bytes | None = None
    #: When this stream first showed a Python traceback (monotonic seconds), if ever.
    traceback_at: float | None = None

    def __post_init__(self) -> None:
        if self.on_pid is not None:
            self._marker_pending = b""

    def feed(self, data: bytes) -> None:
        """Route a chunk of this instance's bytes."""
        if self._marker_pending is not None:
            data = self._strip_marker(data)
            if not data:
                return
        lines = self.splitter.feed(data)
        if lines:
            self._emit(lines)

    def close(self) -> None:
        """End of the run: emit the last partial line with a newline added."""
        if self._marker_pending:
            pending, self._marker_pending = self._marker_pending, None
            self.feed(pending)
        self._marker_pending = None
        rest = self.splitter.flush()
        if rest:
            self._emit([rest + b"\n"], raw=rest)
        if self.file is not None:
            self.file.flush()

    def tail_text(self) -> list[str]:
        """The last lines of this stream, decoded for the failure report."""
        lines = [*self.tail]
        pending = self.splitter._buf
        if pending:
            lines.append(pending)
        return [line.decode("utf-8", "replace").rstrip("\r\n") for line in lines][-TAIL_LINES:]

    def _emit(self, lines: list[bytes], raw: bytes | None = None) -> None:
        if self.on_record is not None:
            lines = [line for line in lines if not self._is_record(line)]
        if self.file is not None:  # the file keeps the bytes as written (``raw``: no newline added)
            self.file.write(b"".join(lines) if raw is None or not lines else raw)
        for line in lines:
            if line.endswith(b"\n") or not line.endswith(b"\r"):
                self.tail.append(line)
            if self.traceback_at is None and line.startswith(_TRACEBACK):
                self.traceback_at = time.monotonic()
        if self.console is not None:
            head = prefix(self.instance, self.kind)
            # A bare carriage return (progress bars start with one) needs no prefix of its own.
            self.console.write(b"".join(line if line == b"\r" else head + line for line in lines))

    def _is_record(self, line: bytes) -> bool:
        """Hand a structured error record line to ``on_record`` (it is data, not output)."""
        if not line.startswith(RECORD_MARKER) or self.on_record is None:
            return False
        self.on_record(self.instance, line)
        return True

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


def open_output_file(directory: str, instance: int, kind: str) -> BinaryIO:
    """``DIR/instance-<i>.<stdout|stderr>``, created with the umask (never world-writable)."""
    path = os.path.join(directory, f"instance-{instance}.{kind}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb", buffering=0)
