"""poprun's signal handlers: installed, recording, and the caller's put back (no process)."""

from __future__ import annotations

import signal
import socket

import pytest

from poprun.run.signals import FORWARDED, JOB_CONTROL, Interrupted, SignalInbox

pytestmark = pytest.mark.unit


def _handlers() -> dict[int, object]:
    return {sig: signal.getsignal(sig) for sig in (*FORWARDED, *JOB_CONTROL)}


def test_install_then_restore_puts_every_handler_and_the_wakeup_fd_back() -> None:
    before = _handlers()
    wake_r, wake_w = socket.socketpair()
    wake_w.setblocking(False)
    inbox = SignalInbox().install()
    try:
        assert all(signal.getsignal(sig) != before[sig] for sig in FORWARDED)
        inbox.watch_job_control(wake_w.fileno())
        assert all(signal.getsignal(sig) != before[sig] for sig in JOB_CONTROL)
    finally:
        inbox.restore()
        wake_r.close()
        wake_w.close()
    assert _handlers() == before
    assert signal.set_wakeup_fd(-1) == -1  # no wake-up descriptor left behind


def test_the_first_signal_before_the_launch_interrupts_and_a_second_is_only_recorded() -> None:
    inbox = SignalInbox().install()
    try:
        with pytest.raises(Interrupted) as stop:
            signal.raise_signal(signal.SIGINT)
        assert stop.value.signum == signal.SIGINT
        signal.raise_signal(signal.SIGTERM)  # while poprun unwinds: no second exception
        assert inbox.received == [signal.SIGINT, signal.SIGTERM]
    finally:
        inbox.restore()


def test_while_the_job_runs_signals_are_only_recorded_and_wake_the_loop() -> None:
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    inbox = SignalInbox().install()
    try:
        inbox.watch_job_control(wake_w.fileno())
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        assert inbox.received == [signal.SIGINT, signal.SIGINT]
        assert wake_r.recv(64)  # the supervisor's selector wakes
        inbox.unwatch_job_control()
        signal.raise_signal(signal.SIGHUP)  # as poprun ends: still recorded, never fatal
        assert inbox.received[-1] == signal.SIGHUP
    finally:
        inbox.restore()
        wake_r.close()
        wake_w.close()
