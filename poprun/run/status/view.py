"""One attempt's progress as poprun shows it: the live summary on request, the table at the end.

The supervisor keeps one :class:`ProgressView` per attempt, beside its progress board, and
calls it at two moments: in its loop (:meth:`ProgressView.answer`: a summary signal arrived,
print the live table) and after the attempt (:meth:`ProgressView.print_report`: the
per-instance table and the straggler, for a job of several instances that reported). The
text is :mod:`poprun.run.status.stragglers`'; this module only decides when and where (poprun's
stderr, where its other reports go).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from poprun.run.status.figures import Figures


class ProgressView:
    """What one attempt shows of its instances' progress."""

    def __init__(self, snapshot: Callable[[], Sequence[Figures]], instances: int) -> None:
        self.snapshot = snapshot
        self.instances = instances
        #: When the attempt started (poprun's monotonic clock): the span of the figures.
        self.started = time.monotonic()
        self._answered = 0  # summary requests already answered

    def answer(self, requests: int) -> None:
        """``requests`` summary signals so far: print the live table if one is new (several
        that arrived together get one table); the job goes on."""
        if requests == self._answered:
            return
        from poprun.run.status.stragglers import summary

        self._answered = requests
        now = time.monotonic()
        text = summary(list(self.snapshot()), now, instances=self.instances, started=self.started)
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def print_report(self) -> None:
        """The end of the attempt: the table and the straggler (nothing for one instance, or
        when no instance reported progress)."""
        if self.instances < 2:
            return
        from poprun.run.status.stragglers import report

        text = report(list(self.snapshot()), self.started)
        if text:
            sys.stderr.write(text + "\n")
