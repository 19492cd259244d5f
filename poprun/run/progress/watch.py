"""The supervisor's side of the progress board: records in, verdicts carried out.

One :class:`ProgressWatch` per attempt of the job. The router puts each progress record on
its board (:mod:`poprun.run.progress.board`) and calls :meth:`ProgressWatch.progressed`,
which tells the ending policy (the hang clock) and asks it to end the job when the board
found two instances out of step. When the policy decides (a note, a hang, a desync),
:meth:`ProgressWatch.carry_out` prints or keeps the report (:mod:`poprun.run.progress.diagnosis`)
and says whether the job must be ended; the supervisor ends it as it ends a timed-out job.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from popdist.env import PROGRESS
from poprun.plan.topology import InstancePlan
from poprun.run.ending import Action, Do, EndingPolicy
from poprun.run.progress.board import ProgressBoard
from poprun.run.progress.diagnosis import desync_report, hang_report, wait_note

#: The policy's decisions this module carries out.
DIAGNOSES = frozenset({Do.HANG, Do.HANG_REPORT, Do.NOTE, Do.DESYNC})


def with_secret(env: Mapping[str, str]) -> dict[str, str]:
    """mpirun's environment with a fresh secret for the job's progress records."""
    # os.urandom is what secrets.token_hex reads; importing secrets (hmac, hashlib,
    # random, base64) would cost every launch a few milliseconds.
    return {**env, PROGRESS: os.urandom(16).hex()}


class ProgressWatch:
    """One attempt's progress board and what the policy decides from it."""

    def __init__(
        self,
        policy: EndingPolicy,
        instances: Sequence[InstancePlan],
        env: Mapping[str, str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.instances = [(plan.index, plan.host) for plan in instances]
        self.secret = env.get(PROGRESS, "")
        self.clock = clock
        #: What the instances report of their progress; the status endpoint reads it too.
        self.board = ProgressBoard(clock)
        #: The hang or desync verdict, for the ending's report.
        self.diagnosis = ""
        #: Every note and verdict so far, as (kind, text): ``note``, ``hang``, ``desync``
        #: (the status page shows them).
        self.notes: list[tuple[str, str]] = []
        self._found: list[Action] = []

    def progressed(self, moved: bool) -> None:
        """A record reached the board (``moved``: it showed progress)."""
        self.policy.progressed(moved, finishing=self.board.finishing())
        if self.board.desync() is not None:
            self._found += self.policy.desynced()

    def found(self) -> list[Action]:
        """What the records since the last call made the policy decide (a desync's end)."""
        found, self._found = self._found, []
        return found

    def carry_out(self, action: Action) -> bool:
        """Print a note or an ``--on-hang=report`` verdict; keep a hang's or a desync's report.

        Returns whether the job must now be ended (SIGTERM, as at ``--timeout``).
        """
        figures = self.board.snapshot()
        now = self.clock()
        timeout = self.policy.hang.timeout or 0.0
        if action.do is Do.NOTE:
            note = wait_note(figures, now=now, timeout=timeout)
            if note:
                sys.stderr.write(note + "\n")
                self.notes.append(("note", note))
            return False
        if action.do is Do.DESYNC:
            desync = self.board.desync()
            report = desync_report(desync) if desync is not None else ""
        else:
            report = hang_report(figures, self.instances, now=now, timeout=timeout)
        self.notes.append(("desync" if action.do is Do.DESYNC else "hang", report))
        if action.do is Do.HANG_REPORT:
            sys.stderr.write(report + "\npoprun: the job goes on (--on-hang=report)\n")
            return False
        self.diagnosis = report
        return True
