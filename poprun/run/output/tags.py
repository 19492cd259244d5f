"""mpirun's tagged output pipes → each instance's own bytes, and mpirun's own text.

mpirun tags each chunk it forwards with ``[job,rank]<stdout>:`` and again after every
``\\n`` inside the chunk, but not at ``\\r`` and not where a line continues in the next
chunk (so partial lines come out as ``[1,0]<stdout>:abc[1,1]...[1,0]<stdout>:def``).
:class:`TagDemux` turns that byte stream back into each instance's own bytes (for the
instances on other hosts; those on poprun's host write to their FIFOs,
:mod:`poprun.run.output.fifos`) and hands untagged lines (mpirun's own text) on.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_TAG = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>:")
_TAG_PREFIX = re.compile(rb"\[\d*(?:,\d*(?:\](?:<[a-z]{0,7}>?)?)?)?")


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


class TagDemux:
    """Split one of mpirun's tagged output pipes into (rank, kind, bytes) and mpirun's own text."""

    def __init__(
        self, on_instance: Callable[[int, str, bytes], None], on_untagged: Callable[[bytes], None]
    ) -> None:
        self.on_instance = on_instance
        self.on_untagged = on_untagged
        self._buf = b""
        self._current: tuple[int, str] | None = None  # inside a tagged segment
        self._tag = b""  # the tag that opened it

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
