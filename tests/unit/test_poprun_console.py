"""poprun's own streams: closed at start, or closed by the reader, never a traceback."""

from __future__ import annotations

import os

import pytest

from poprun.run.output.console import QuietFd

pytestmark = pytest.mark.unit


def test_a_writer_whose_reader_went_away_goes_quiet() -> None:
    read, write = os.pipe()
    os.close(read)
    quiet = QuietFd(write)
    try:
        assert quiet.write(b"x" * 100) == 100  # EPIPE: dropped, no exception
        assert quiet.reader_gone
        assert quiet.write(b"more") == 4  # and from now on into /dev/null
    finally:
        os.close(write)
