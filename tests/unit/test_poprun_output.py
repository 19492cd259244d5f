"""Output plumbing: mpirun's tag framing undone, lines re-prefixed, pid marker stripped."""

from __future__ import annotations

import io
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest

from poprun.run.evidence import MpirunMessages
from poprun.run.output import instance_stream as output
from poprun.run.output import tags
from poprun.run.output.instance_stream import InstanceStream, LineSplitter
from poprun.run.output.tags import TagDemux

pytestmark = pytest.mark.unit


def _demux(chunks: list[bytes]) -> tuple[dict[tuple[int, str], bytes], bytes]:
    got: dict[tuple[int, str], bytes] = {}
    untagged: list[bytes] = []

    def on_instance(rank: int, kind: str, data: bytes) -> None:
        got[(rank, kind)] = got.get((rank, kind), b"") + data

    demux = TagDemux(on_instance, untagged.append)
    for chunk in chunks:
        demux.feed(chunk)
    demux.close()
    return got, b"".join(untagged)


# What Open MPI 4.1 wrote for two ranks each writing b"abc", b"def\nghi\rjkl", one byte
# of "é", the other, then b"tail" (recorded from a real run).
RECORDED = (
    b"[1,0]<stdout>:abc[1,1]<stdout>:abc[1,0]<stdout>:def\n[1,0]<stdout>:ghi\rjkl"
    b"[1,1]<stdout>:def\n[1,1]<stdout>:ghi\rjkl[1,0]<stdout>:\xc3[1,1]<stdout>:\xc3"
    b"[1,0]<stdout>:\xa9\n[1,0]<stdout>:tail[1,1]<stdout>:\xa9\n[1,1]<stdout>:tail"
)


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_recorded_stream_in_any_chunking(size: int) -> None:
    chunks = [RECORDED[i : i + size] for i in range(0, len(RECORDED), size)]
    got, untagged = _demux(chunks)
    expected = "abcdef\nghi\rjklé\ntail".encode()
    assert got == {(0, "stdout"): expected, (1, "stdout"): expected}
    assert untagged == b""


def test_mpirun_own_text_is_separated() -> None:
    got, untagged = _demux([b"[1,0]<stderr>:boom\n-----\nPrimary job\n[1,1]<stderr>:x\n"])
    assert got == {(0, "stderr"): b"boom\n", (1, "stderr"): b"x\n"}
    assert untagged == b"-----\nPrimary job\n"


def test_line_splitter_handles_cr_crlf_and_partial() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"10%\r20%\r") == [b"10%\r"]
    assert splitter.feed(b"\nnext\r\nab") == [b"20%\r\n", b"next\r\n"]
    assert splitter.flush() == b"ab"


def test_instance_stream_prefixes_strips_marker_and_copies() -> None:
    console, copy = io.BytesIO(), io.BytesIO()
    pids: dict[int, int] = {}
    stream = InstanceStream(2, "stderr", console, copy, on_pid=pids.__setitem__)  # type: ignore[arg-type]
    for part in (b"\x1fpoprun-p", b"id=42\nfir", b"st\nprog 1\rprog 2\r", "é".encode()[:1]):
        stream.feed(part)
    stream.feed("é".encode()[1:] + b" no newline")
    stream.close()
    assert pids == {2: 42}
    assert copy.getvalue() == "first\nprog 1\rprog 2\ré no newline".encode()
    assert (
        console.getvalue()
        == (
            "[1,2]<stderr>:first\n[1,2]<stderr>:prog 1\r[1,2]<stderr>:prog 2\r"
            "[1,2]<stderr>:é no newline\n"
        ).encode()
    )
    assert stream.tail_text() == ["first", "é no newline"]


def test_a_progress_bar_gets_one_prefix_per_redraw() -> None:
    # tqdm starts every redraw with a bare \r: it must not print a prefix of its own.
    console = io.BytesIO()
    stream = InstanceStream(0, "stderr", console)  # type: ignore[arg-type]
    stream.feed(b"\r 10%\r 20%\r")
    stream.close()
    assert (
        console.getvalue() == b"\r[1,0]<stderr>: 10%\r[1,0]<stderr>: 20%\r\n"
    )  # closed: ends the line


def test_stream_without_marker_is_untouched() -> None:
    console = io.BytesIO()
    stream = InstanceStream(0, "stderr", console, on_pid=lambda i, p: None)  # type: ignore[arg-type]
    stream.feed(b"\x1fnot a marker\n")
    stream.close()
    assert console.getvalue() == b"[1,0]<stderr>:\x1fnot a marker\n"


def test_failure_boxes_are_parsed_and_swallowed() -> None:
    messages = MpirunMessages()
    text = (
        "-" * 74 + "\nPrimary job  terminated normally, but 1 process returned\n"
        "a non-zero exit code. Per user-direction, the job has been aborted.\n"
        + "-" * 74
        + "\n"
        + "-" * 74
        + "\nmpirun detected that one or more processes exited with non-zero status\n\n"
        "  Process name: [[30594,1],1]\n  Exit code:    3\n" + "-" * 74 + "\n"
    )
    shown = [line for raw in text.splitlines(keepends=True) for line in messages.feed_line(raw)]
    assert shown == []
    assert messages.failure is not None
    assert (messages.failure.instance, messages.failure.exit_code) == (1, 3)


def test_signal_message_and_unrelated_box() -> None:
    messages = MpirunMessages()
    messages.feed_line("-" * 74)
    messages.feed_line(
        "mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed)."
    )
    messages.feed_line("-" * 74)
    assert messages.failure is not None and messages.failure.poprun_exit_code == 137
    shown = [
        *messages.feed_line("-" * 74),
        *messages.feed_line("Some other trouble"),
        *messages.feed_line("-" * 74),
    ]
    assert "Some other trouble" in shown


def _line_events(fn: Callable[[], object], budget: int, module: str = output.__file__) -> int:
    """How many Python lines of ``module`` ``fn`` executes; raises past ``budget``."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> object:
        nonlocal count
        if frame.f_code.co_filename != module:
            return None
        if event == "line":
            count += 1
            if count > budget:
                raise AssertionError(f"more than {budget} lines executed: not linear")
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def test_a_long_line_without_newline_is_not_rescanned() -> None:
    # The work per chunk must not grow with the open line: 400 chunks of 10 kB (4 MB of
    # one line) may cost a few dozen Python lines each, not one per byte held.
    splitter = LineSplitter()
    got: list[bytes] = []

    def feed_all() -> None:
        for _ in range(400):
            got.extend(splitter.feed(b"x" * 10_000))
        got.extend(splitter.feed(b"end\r\n"))

    _line_events(feed_all, budget=400 * 30)
    assert got == [b"x" * 4_000_000 + b"end\r\n"]
    assert splitter.flush() == b""


def test_a_flood_of_short_lines_costs_per_chunk_not_per_line() -> None:
    splitter = LineSplitter()
    chunk = b"".join(b"line %05d\n" % i for i in range(5000))
    got: list[bytes] = []
    _line_events(lambda: got.extend(splitter.feed(chunk)), budget=50)
    assert got == chunk.splitlines(keepends=True)


def test_tag_demux_hands_on_a_tagged_flood_in_one_piece() -> None:
    # mpirun tags every line: one call per line would cost more than the bytes themselves.
    lines = [b"[1,0]<stdout>:" + b"y" * 200 + b"\n" for _ in range(500)]
    seen: list[bytes] = []
    demux = TagDemux(lambda rank, kind, data: seen.append(data), lambda data: None)
    assert _line_events(lambda: demux.feed(b"".join(lines)), 500 * 40, tags.__file__) > 0
    assert seen == [b"".join(line[len(b"[1,0]<stdout>:") :] for line in lines)]


@pytest.mark.parametrize("seed", range(20))
def test_line_splitter_agrees_with_splitlines_in_any_chunking(seed: int) -> None:
    rng = random.Random(seed)
    whole = bytes(rng.choice(b"ab\r\n") for _ in range(rng.randrange(0, 300)))
    splitter = LineSplitter()
    got: list[bytes] = []
    pos = 0
    while pos < len(whole):
        step = rng.randrange(0, 12)
        got += splitter.feed(whole[pos : pos + step])
        pos += step
    rest = splitter.flush()
    assert got + ([rest] if rest else []) == whole.splitlines(keepends=True)


def test_a_line_longer_than_the_limit_streams_with_one_prefix() -> None:
    console = io.BytesIO()
    stream = InstanceStream(2, "stdout", console)
    piece = b"z" * 10_000
    for _ in range(20):  # 200 kB of one line: it reaches the console before it ends
        stream.feed(piece)
    shown = console.getvalue()
    assert shown.startswith(b"[1,2]<stdout>:z") and len(shown) > output.OPEN_LINE_BYTES
    assert len(stream.splitter.pending()) <= output.OPEN_LINE_BYTES  # bounded memory
    stream.feed(b"end\nnext\n")
    stream.close()
    assert console.getvalue() == b"[1,2]<stdout>:" + piece * 20 + b"end\n[1,2]<stdout>:next\n"


def test_a_restart_appends_to_the_output_files(tmp_path: Path) -> None:
    for append, text in ((False, b"first attempt\n"), (True, b"second attempt\n")):
        handle = output.open_output_file(str(tmp_path), 0, "stdout", append=append)
        handle.write(text)
        handle.close()
    assert (tmp_path / "instance-0.stdout").read_bytes() == b"first attempt\nsecond attempt\n"
    output.open_output_file(str(tmp_path), 0, "stdout").close()  # a new job starts afresh
    assert (tmp_path / "instance-0.stdout").read_bytes() == b""
