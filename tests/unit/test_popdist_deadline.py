"""popdist's side of the time-limit notice: SIGUSR1 becomes a flag, nothing else."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest

import popdist
from popdist import deadline

pytestmark = pytest.mark.unit


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No handler installed, no notice received; the process's handler put back after."""
    before = signal.getsignal(signal.SIGUSR1)
    monkeypatch.setattr(deadline._Notice, "received", False)
    monkeypatch.setattr(deadline._Notice, "installed", False)
    monkeypatch.setattr(deadline._Notice, "previous", None)
    for name in list(os.environ):
        if name.startswith("POPDIST_"):
            monkeypatch.delenv(name)
    yield
    signal.signal(signal.SIGUSR1, before)


def test_outside_poprun_nothing_is_installed(fresh: None) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    assert not deadline.install_if_asked({})
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN


def test_under_poprun_the_notice_sets_the_flag_and_the_program_goes_on(fresh: None) -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # as the instance wrapper starts programs
    assert deadline.install_if_asked({"POPDIST_NUM_INSTANCES": "1"})
    assert not popdist.notice_received()
    assert not popdist.should_stop()  # one instance: its own flag, no communication
    os.kill(os.getpid(), signal.SIGUSR1)
    assert popdist.notice_received()
    assert popdist.should_stop()


def test_a_handler_the_program_installed_before_is_still_called(fresh: None) -> None:
    seen: list[int] = []

    def own(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    signal.signal(signal.SIGUSR1, own)
    assert deadline.install()
    assert deadline.install()  # once is enough
    os.kill(os.getpid(), signal.SIGUSR1)
    assert seen == [signal.SIGUSR1]
    assert deadline.notice_received()
