"""poprun's signal handlers: installed first thing, never reset to the default while a job runs,
and the caller's put back when an in-process ``main`` returns.

SIGINT, SIGTERM and SIGHUP are *recorded* (:class:`SignalInbox`): the supervisor reads them
from the inbox, through a wake-up socket, and the ending policy decides what they mean.
Before the job is launched, the first one interrupts what poprun is doing (a long ssh check,
say) with :class:`Interrupted`, which ``main`` turns into exit code 128+N; a second one
only adds to the record. Python's default SIGINT handler, which raises
``KeyboardInterrupt`` anywhere, is never in place from then on, so no signal, however
close to another, can end poprun by a signal instead of an exit code.

The handlers change process-wide state; :meth:`SignalInbox.restore` puts back the previous
handlers and wake-up descriptor (``main`` does so when called in-process, on every path).

The summary signals (:func:`summary_signals`: SIGUSR2, and SIGUSR1 outside a Slurm job) ask
for the live per-instance summary, Ctrl-T style: recorded as a count the supervisor reads,
never forwarded, never an interruption. They are installed with the others, first thing,
so one that arrives early cannot end poprun by its default action.

Inside a Slurm job SIGUSR1 is the time-limit notice (:func:`notice_signals`; ``sbatch
--signal=B:USR1@N``): recorded in :attr:`SignalInbox.notices`, never an interruption, and
the ending policy sends the instances the save-now notice (:mod:`poprun.run.time_limit`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

#: Signals poprun forwards to the job (and counts: a second one ends the job at once).
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Job control: Ctrl-Z stops the instances with poprun, ``fg``/``bg`` continues them.
JOB_CONTROL = (signal.SIGTSTP, signal.SIGCONT)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def summary_signals(environ: Mapping[str, str]) -> tuple[signal.Signals, ...]:
    """The signals that ask poprun for the live summary.

    SIGUSR2 always. SIGUSR1 (what ``kill -USR1`` users reach for, BSD's Ctrl-T being
    SIGINFO, which Linux lacks) only outside a Slurm job: inside one, ``sbatch
    --signal=B:USR1@N`` is the time-limit notice, which must never be taken for a request
    to print.
    """
    if environ.get("SLURM_JOB_ID"):
        return (signal.SIGUSR2,)
    return (signal.SIGUSR1, signal.SIGUSR2)


def notice_signals(environ: Mapping[str, str]) -> tuple[signal.Signals, ...]:
    """The signals that bring the time-limit notice: SIGUSR1 inside a Slurm job, else none."""
    if environ.get("SLURM_JOB_ID"):
        return (signal.SIGUSR1,)
    return ()


def hold_until_exit() -> None:
    """Block SIGINT, SIGTERM and SIGHUP for the rest of the process: poprun has its exit
    code and is on its way out (flushing its output, then ``os._exit``). A second Ctrl-C
    that arrived just then (as poprun ends the job the first one ended) must not kill
    poprun by SIGINT instead of letting it exit 130, whatever handler is in place by then.
    Blocked, the signal stays pending and goes with the process."""
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)


class Interrupted(BaseException):
    """A signal arrived before the job was launched: poprun stops and exits 128+N.

    A ``BaseException``, as ``KeyboardInterrupt`` is: no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class SignalInbox:
    """Where poprun's signal handlers put what they receive."""

    def __init__(self) -> None:
        #: The forwarded signals received, in order.
        self.received: list[int] = []
        #: Job-control signals not yet handled by the supervisor.
        self.job_control: list[int] = []
        #: Summary requests received (the supervisor prints one for each it has not yet).
        self.summaries = 0
        #: Time-limit notices received (SIGUSR1 in a Slurm job), in order.
        self.notices: list[int] = []
        #: Raise :class:`Interrupted` at the first signal (before the job is launched).
        self.interrupting = True
        #: Interrupted was raised once (a signal that lands in the import machinery is not
        #: raised there: see :func:`_in_import_machinery`).
        self._raised = False
        self._previous: dict[int, Handler] = {}
        self._previous_wakeup: int | None = None

    def install(self) -> SignalInbox:
        """Record SIGINT/SIGTERM/SIGHUP and the summary requests from now on; remember the
        handlers they replace."""
        for sig in FORWARDED:
            self._previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._on_signal)
        for sig in summary_signals(os.environ):
            self._previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._on_summary)
        for sig in notice_signals(os.environ):
            self._previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._on_notice)
        return self

    def watch_job_control(self, wake_fd: int) -> None:
        """While the job runs: record job control too, and write to ``wake_fd`` on any signal."""
        self.interrupting = False
        for sig in JOB_CONTROL:
            self._previous.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, self._on_job_control)
        old = signal.set_wakeup_fd(wake_fd, warn_on_full_buffer=False)
        if self._previous_wakeup is None:
            self._previous_wakeup = old

    def unwatch_job_control(self) -> None:
        """The job has ended: job control and the wake-up descriptor as they were.

        SIGINT/SIGTERM/SIGHUP stay recorded: one that arrives as poprun ends must not
        turn its exit code into death by that signal.
        """
        if self._previous_wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            self._previous_wakeup = None
        for sig in JOB_CONTROL:
            if sig in self._previous:
                signal.signal(sig, self._previous.pop(sig))

    def restore(self) -> None:
        """Every handler (and the wake-up descriptor) as it was before :meth:`install`."""
        self.unwatch_job_control()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self.interrupting and not self._raised and not _in_import_machinery(frame):
            self._raised = True
            raise Interrupted(signum)

    def _on_job_control(self, signum: int, frame: FrameType | None) -> None:
        self.job_control.append(signum)

    def _on_summary(self, signum: int, frame: FrameType | None) -> None:
        self.summaries += 1

    def _on_notice(self, signum: int, frame: FrameType | None) -> None:
        self.notices.append(signum)


def _in_import_machinery(frame: FrameType | None) -> bool:
    """Whether the signal landed in importlib's own frames (a module lock's weakref callback,
    say): an exception raised there is printed as "Exception ignored" with a traceback and
    lost. The signal stays recorded, and the next step of the start-up (or the supervisor,
    which reads :attr:`SignalInbox.received` when it takes over) ends the run with 128+N."""
    return frame is not None and frame.f_code.co_filename.startswith("<frozen importlib")
