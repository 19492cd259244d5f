"""When a job is hung (pure): ``--hang-timeout`` seconds in which no instance made progress.

:class:`HangWatch` is the part of the ending policy (:mod:`poprun.run.ending`) that keeps the
hang clock: it restarts whenever a progress record shows an instance moved (a collective
issued or finished, a step). It starts at the first progress of any instance, so start-up
(imports, a slow rendezvous) is never called a hang, nor a program that never imports popdist
(it reports nothing); and it does not run while poprun is stopped (Ctrl-Z). Part of the way (:data:`NOTE_FRACTION`) it asks for the note on a long
wait; at the time-out for the verdict (once per quiet spell with ``--on-hang=report``).
It reads time only from the times it is given.
"""

from __future__ import annotations

import enum

#: After this fraction of ``--hang-timeout`` without progress, the note on who the others wait
#: for (a long evaluation); the instances send their stacks from half of it on.
NOTE_FRACTION = 0.6


class Hang(enum.Enum):
    """What the hang clock calls for."""

    NOTE = "note"
    HUNG = "hung"
    REPORT = "report"


class HangWatch:
    """The hang clock of one attempt of the job."""

    def __init__(self, timeout: float | None = None, on_hang: str = "kill") -> None:
        self.timeout = timeout
        self.on_hang = on_hang
        self.reset()

    def reset(self) -> None:
        """A new attempt: no record yet."""
        #: When an instance last made progress (None: no progress record yet).
        self.last_progress: float | None = None
        self.hung = False
        self.reported = False
        self.noted = False
        self.finishing = False

    def progressed(self, moved: bool, t: float, *, finishing: bool = False) -> None:
        """A progress record arrived at ``t``; ``moved``: it showed progress (the clock starts
        at the first that does)."""
        if moved:
            self.last_progress = t
            self.reported = self.noted = False
        self.finishing = finishing  # every instance has ended its program: no hang now

    def stopped_for(self, seconds: float) -> None:
        """poprun (and its instances) were stopped this long: a stopped job is not hung."""
        if self.last_progress is not None:
            self.last_progress += seconds

    def next_check(self) -> float | None:
        """When the clock next matters (None: it does not)."""
        if self.timeout is None or self.last_progress is None or self.hung or self.reported:
            return None
        if self.finishing:
            return None
        fraction = 1.0 if self.noted else NOTE_FRACTION
        return self.last_progress + self.timeout * fraction

    def due(self, t: float) -> Hang | None:
        """What ``t`` calls for: the note, the verdict, or nothing."""
        if self.next_check() is None or self.last_progress is None or self.timeout is None:
            return None
        quiet = t - self.last_progress
        if quiet >= self.timeout:
            if self.on_hang == "report":
                self.reported = True
                return Hang.REPORT
            self.hung = True
            return Hang.HUNG
        if quiet >= self.timeout * NOTE_FRACTION and not self.noted:
            self.noted = True
            return Hang.NOTE
        return None
