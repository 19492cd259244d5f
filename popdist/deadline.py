"""The time-limit notice as a training loop sees it: save now, then stop.

When the job's time limit nears (``sbatch --signal=B:USR1@N``, or ``poprun
--time-limit-margin``), poprun sends every instance SIGUSR1 (:data:`NOTICE_SIGNAL`), and
sends it again every few seconds until the job ends. Under poprun, ``import popdist``
installs a handler that only sets a flag: nothing is interrupted, no exception is raised in
the middle of a step, other threads' system calls are restarted, and a handler the program
installed before keeps being called. The training loop asks at a point of its choosing::

    start = resume_checkpoint(path, model=model, optimizer=optimizer, dataloader=loader)
    for step in range(start, total_steps):
        training(x, y)
        if popdist.should_stop():  # every instance, at the same point of each step
            save_checkpoint(path, model=training, optimizer=optimizer,
                            step=step + 1, dataloader=loader)
            break  # poprun then exits 75 (and requeues the job with --requeue-on-timeout)

(``popdist_torch.checkpoint.save_on_notice`` is those three lines.)

:func:`should_stop` is a collective: the signal reaches the instances at slightly different
moments, so each one's own flag may change between two steps on one instance and not yet
on another; if they acted on it alone, one would go to save while another waits in the
next step's allreduce. :func:`should_stop` agrees first (one allgather of a flag), so every
instance gets the same answer at the same step. :func:`notice_received` is this instance's
flag alone, with no communication.

The instance wrappers start the program with SIGUSR1 ignored, so a program that never
imports popdist, or one still starting, is not killed by the notice (it gets the next one);
at exit popdist ignores it again, so one that comes while the instance ends cannot kill it
either.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading

from popdist.env import NUM_INSTANCES, read_run

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import FrameType
    from typing import Any

__all__ = ["NOTICE_SIGNAL", "notice_received", "should_stop"]

#: How poprun's save-now notice reaches an instance.
NOTICE_SIGNAL = signal.SIGUSR1


class _Notice:
    """This process's flag, and the handler it replaced (called too, when it was one)."""

    received = False
    previous: Any = None
    installed = False


def _on_notice(signum: int, frame: FrameType | None) -> None:
    _Notice.received = True  # only a flag: safe whatever the main thread was doing
    if callable(_Notice.previous):
        _Notice.previous(signum, frame)


def install() -> bool:
    """Turn :data:`NOTICE_SIGNAL` into the flag from now on; whether it could (main thread)."""
    if _Notice.installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False  # signal handlers can only be set there
    previous = signal.getsignal(NOTICE_SIGNAL)
    signal.signal(NOTICE_SIGNAL, _on_notice)
    signal.siginterrupt(NOTICE_SIGNAL, False)  # other threads' system calls restart
    _Notice.previous = previous
    _Notice.installed = True
    atexit.register(_ignore_from_now_on)
    return True


def _ignore_from_now_on() -> None:
    """At exit, ignore the notice again: Python's finalisation resets a signal that has a
    Python handler to its default (for SIGUSR1: end the process), and the notice is sent
    again until the job ends, so a late one would kill an instance that saved and is
    leaving. The handler it replaced is also let go: the program is ending."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(NOTICE_SIGNAL, signal.SIG_IGN)


def install_if_asked(environ: Mapping[str, str] | None = None) -> bool:
    """Install the handler when poprun launched this process (its ``POPDIST_*`` set)."""
    environ = os.environ if environ is None else environ
    if NUM_INSTANCES not in environ:
        return False
    return install()


def notice_received() -> bool:
    """Whether poprun's save-now notice has reached this instance (no communication)."""
    return _Notice.received


def should_stop() -> bool:
    """Whether the job should save and stop now: the same answer on every instance.

    True once the save-now notice has reached any instance. A collective: every instance
    calls it at the same point (once a step, say, or every N steps when steps are very
    short), in a run of several instances after or without :func:`popdist.init` (the
    backend is started if needed, as for :func:`popdist.execute_on_instances`). A
    one-instance run reads its own flag and communicates nothing.
    """
    local = notice_received()
    if read_run().num_instances == 1:
        return local
    import torch

    from popdist.collectives import for_run

    flags = for_run().allgather(
        torch.tensor([1 if local else 0], dtype=torch.int32), name="popdist.should_stop"
    )
    return bool(flags.any())
