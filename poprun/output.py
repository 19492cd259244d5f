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
#: How many of an instance's last stderr lines the failure report quotes...
TAIL_LINES = 20
#: ... and at most how many bytes of each (the end of a longer line).
TAIL_LINE_BYTES = 4096
#: A line longer than this goes to the console in pieces as it arrives (the first with the
#: prefix), as mpirun forwards it: poprun's memory stays bounded whatever the program writes.
OPEN_LINE_BYTES = 1 << 16
RECORD_MARKER = MARKER.encode()


def prefix(instance: int, kind: str) -> bytes:
    """PopRun's per-line prefix, e.g. ``[1,3]<stderr>:``."""
    return f"[1,{instance}]<{kind}>:".encode()


def _held_tag_start(buf: bytes, pos: int = 0) -> int:
    """Index from which ``buf[pos:]``'s tail could be the start of a tag (``len(buf)`` if none)."""
    start = buf.rfind(b"[", max(pos, len(buf) - 32))
    if start >= 0 and _TAG_PREFIX.fullmatch(buf, start):
        return start
    return len(buf)


#: How far ahead :func:`_same_tag_run` looks at first (it halves that on a mismatch).
_RUN_WINDOW = 65536


def _same_tag_run(buf: bytes, pos: int, tag: bytes) -> tuple[int, bytes]:
    """A stretch from ``pos`` in which ``tag`` is the only tag and follows every line.

    That is mpirun's framing of a burst of output from one stream (it tags every line and
    every piece it forwards). Returns where the stretch ends (just after a ``\\n`` + ``tag``)
    and its bytes with the tags taken out; ``(pos, b"")`` if no stretch passes the checks (a
    line with no tag after it, another tag, tag-like text): the caller then goes line by
    line. Every step is a C-speed pass over at most ``2 × _RUN_WINDOW`` bytes.
    """
    framed = b"\n" + tag
    limit = min(len(buf), pos + _RUN_WINDOW)
    while True:
        last = buf.rfind(framed, pos, limit)
        if last < 0:
            return pos, b""
        end = last + len(framed)
        if buf.count(b"\n", pos, end) == buf.count(framed, pos, end):
            stripped = buf[pos:end].replace(tag, b"")
            if b"]<" not in stripped:
                return end, stripped
        limit = last


@dataclass
class TagDemux:
    """Split one of mpirun's tagged output pipes into (rank, kind, bytes) and mpirun's own text."""

    on_instance: Callable[[int, str, bytes], None]
    on_untagged: Callable[[bytes], None]
    _buf: bytes = b""
    _current: tuple[int, str] | None = None  # inside a tagged segment
    _tag: bytes = b""  # the tag that opened it

    def feed(self, data: bytes) -> None:
        """Consume more bytes from the pipe."""
        self._buf += data
        self._drain(final=False)

    def close(self) -> None:
        """End of pipe: release everything held back."""
        self._drain(final=True)
        self._buf = b""

    def _line_start(
        self, buf: bytes, pos: int, final: bool, hand_on: Callable[[], None]
    ) -> int | None:
        """At the start of a line: open a tagged segment, or hand on one untagged line.

        Returns the position after what was consumed, or None to wait for more bytes.
        """
        match = _TAG.match(buf, pos)
        if match:
            kind = "stderr" if match.group(3) != b"stdout" else "stdout"
            self._current = (int(match.group(2)), kind)
            self._tag = match.group(0)
            return match.end()
        if not final and _TAG_PREFIX.fullmatch(buf, pos):
            return None
        end = buf.find(b"\n", pos)
        if end < 0:
            if not final:
                return None
            end = len(buf) - 1
        hand_on()
        self.on_untagged(buf[pos : end + 1])
        return end + 1

    def _drain(self, *, final: bool) -> None:
        # One pass with a position (slicing the rest off after every line would copy the
        # buffer once per line), and consecutive segments of one stream handed on together:
        # mpirun tags every line, and a call per line would cost more than the bytes.
        buf = self._buf
        pos = 0
        size = len(buf)
        run: list[bytes] = []
        run_key: tuple[int, str] | None = None
        newline = -2  # the next \n at or after pos (-1: none); -2: not looked for yet

        def hand_on() -> None:
            if run and run_key is not None:
                self.on_instance(run_key[0], run_key[1], b"".join(run) if len(run) > 1 else run[0])
            run.clear()

        while pos < size:
            if self._current is None:
                after = self._line_start(buf, pos, final, hand_on)
                if after is None:
                    break  # maybe the start of a tag, or a line not ended yet: wait for more
                pos = after
                continue
            if self._current != run_key:
                hand_on()
                run_key = self._current
            if newline != -1 and newline < pos:  # -1: none in the rest of the buffer
                newline = buf.find(b"\n", pos)
            if newline >= 0:
                end, stripped = _same_tag_run(buf, pos, self._tag)
                if end > pos:  # many lines of this stream in a row: one step, done in C
                    run.append(stripped)
                    pos = end
                    continue
            tag = _TAG.search(buf, pos, newline + 1 if newline >= 0 else size)
            if tag is not None:
                if tag.start() > pos:
                    run.append(buf[pos : tag.start()])
                pos = tag.start()
                self._current = None
                continue
            if newline >= 0:
                run.append(buf[pos : newline + 1])
                pos = newline + 1
                self._current = None
                continue
            keep = size if final else _held_tag_start(buf, pos)
            if keep > pos:
                run.append(buf[pos:keep])
            pos = keep
            break
        hand_on()
        self._buf = buf[pos:] if pos else buf


@dataclass
class LineSplitter:
    """Cut a byte stream into lines ending in ``\\n``, ``\\r\\n`` or ``\\r``.

    Linear in the bytes fed: each chunk is searched once (in C, by ``bytes.rfind`` and
    ``bytes.splitlines``) and a line still open is kept as a list of pieces, never rescanned.
    """

    _parts: list[bytes] = field(default_factory=list)
    #: The open line ended in ``\\r``: it may be the first half of ``\\r\\n``.
    _cr: bool = False

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
    #: The console already has the start of the open line (see :data:`OPEN_LINE_BYTES`).
    _mid_line: bool = False

    def __post_init__(self) -> None:
        if self.on_pid is not None:
            self._marker_pending = b""

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
        if self.on_record is not None and RECORD_MARKER in text:
            kept = [line for line in text.splitlines(keepends=True) if not self._is_record(line)]
            text = b"".join(kept)
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


def open_output_file(directory: str, instance: int, kind: str, *, append: bool = False) -> BinaryIO:
    """``DIR/instance-<i>.<stdout|stderr>``, created with the umask (never world-writable).

    ``append``: a restarted job (``--max-restarts``) adds to the failed attempt's output.
    """
    path = os.path.join(directory, f"instance-{instance}.{kind}")
    keep = os.O_APPEND if append else os.O_TRUNC
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | keep | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb", buffering=0)
