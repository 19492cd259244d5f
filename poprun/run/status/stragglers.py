"""The per-instance table and the straggler (pure): printed at the end of a multi-instance run
and, live, on the summary signal.

In a data-parallel job every step ends in a collective, so every instance steps at the pace
of the slowest one: the step times are alike and the slow instance does not show there. It
shows in the waiting: the others finish their own work first and wait in the collective for
it. So the straggler is the instance with the most *own work* a step (mean step time less
its waiting a step, :func:`~poprun.run.status.figures.own_work_s`), and what it cost the
others is their waiting beyond its own, measured, not inferred: each other instance's
waiting time less the straggler's (the straggler waits only for the reduction itself).

It is named only when the spread is worth a user's attention, both:

- its own work a step exceeds the median of the others' by at least :data:`SPREAD` (10 %):
  instances doing the same work differ by a few percent from scheduling and caches alone,
  and naming one for that would be noise;
- the others lost at least :data:`COST` (5 %) of their step time waiting for it: a
  straggler that costs the job less is not worth acting on, even when relatively slow
  (short steps dominated by the reduction).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from poprun.run.status.figures import (
    Figures,
    busy_s,
    own_work_s,
    progress_age_s,
    reported,
    seconds,
    size,
    wait_share,
)

#: The slowest instance's own work a step must exceed the others' median by this share.
SPREAD = 0.10
#: ... and the others must have spent this share of their step time waiting for it.
COST = 0.05

PREFIX = "poprun: "


@dataclass(frozen=True)
class Straggler:
    """The instance that held the others up, and what it cost them."""

    instance: int
    host: str
    #: Its own work a step, and the median of the others' (seconds).
    own_s: float
    others_own_s: float
    #: The others' waiting beyond the straggler's, added up over them (seconds) ...
    cost_s: float
    #: ... a step, per other instance (seconds) ...
    cost_per_step_s: float
    #: ... and as a share of the others' time in steps.
    cost_share: float

    @property
    def spread(self) -> float:
        """How much more own work a step than the others' median (0.5: 50 % more)."""
        if self.others_own_s <= 0:
            return float("inf") if self.own_s > 0 else 0.0
        return self.own_s / self.others_own_s - 1.0

    @property
    def worth_naming(self) -> bool:
        """Both thresholds met (see the module's docstring for why these)."""
        return self.spread >= SPREAD and self.cost_share >= COST

    def line(self) -> str:
        """One sentence naming it and its cost."""
        return (
            f"{PREFIX}instance {self.instance} ({self.host}) held the others up: "
            f"{seconds(self.own_s)} of its own work a step against {seconds(self.others_own_s)} "
            f"for the others; they waited {seconds(self.cost_per_step_s)} a step for it "
            f"({seconds(self.cost_s)} in all, {self.cost_share:.0%} of their time)"
        )


def slowest(figures: Sequence[Figures]) -> Straggler | None:
    """The instance with the most own work a step and its cost to the others; None with
    fewer than two instances that have stepped."""
    stepped = [f for f in figures if own_work_s(f) is not None]
    if len(stepped) < 2:
        return None
    worst = max(stepped, key=lambda f: (own_work_s(f) or 0.0, -f.instance))
    others = [f for f in stepped if f is not worst]
    extra = [max(0.0, f.wait_s - worst.wait_s) for f in others]
    cost = sum(extra)
    others_busy = sum(busy_s(f) for f in others)
    per_step = statistics.mean(e / f.steps for e, f in zip(extra, others, strict=True))
    return Straggler(
        instance=worst.instance,
        host=worst.host,
        own_s=own_work_s(worst) or 0.0,
        others_own_s=statistics.median(own_work_s(f) or 0.0 for f in others),
        cost_s=cost,
        cost_per_step_s=per_step,
        cost_share=cost / others_busy if others_busy > 0 else 0.0,
    )


def _waiting(f: Figures) -> str:
    share = wait_share(f)
    if share is None:
        return seconds(f.wait_s) if f.wait_s > 0 else "-"
    return f"{share:.0%} ({seconds(f.wait_s)})"


def rows(figures: Sequence[Figures], now: float | None = None) -> list[str]:
    """The table's lines, aligned (``now`` adds the "last progress" age column)."""
    header = ["instance", "host", "steps", "step time", "own work", "waiting", "peak RSS"]
    body = []
    for f in sorted(figures, key=lambda f: f.instance):
        own = own_work_s(f)
        row = [
            str(f.instance),
            f.host,
            str(f.steps),
            seconds(f.step_time_s) if f.steps > 0 else "-",
            seconds(own) if own is not None else "-",
            _waiting(f),
            size(f.rss_peak_bytes) if f.rss_peak_bytes > 0 else "-",
        ]
        if now is not None:
            row.append(f"{seconds(progress_age_s(f, now))} ago")
        body.append(row)
    if now is not None:
        header.append("last progress")
    widths = [max(len(r[i]) for r in (header, *body)) for i in range(len(header))]
    left = {1}  # the host reads left-aligned; numbers right-aligned

    def render(cells: list[str]) -> str:
        out = (
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return (PREFIX + "  " + "  ".join(out)).rstrip()

    return [render(header), *(render(r) for r in body)]


def report(figures: Sequence[Figures]) -> str:
    """What poprun prints at the end of a run: "" for one instance or when none reported."""
    if len(figures) < 2 or not reported(list(figures)):
        return ""
    lines = [
        f"{PREFIX}progress of the {len(figures)} instances (mean step time; waiting in collectives):"
    ]
    lines += rows(figures)
    found = slowest(figures)
    if found is not None and found.worth_naming:
        lines.append(found.line())
    return "\n".join(lines)


def summary(figures: Sequence[Figures], now: float, *, instances: int, running_s: float) -> str:
    """The live summary (the summary signal): the table, the pending collectives, the
    straggler when worth naming; a line saying so when nothing was reported yet."""
    head = f"{PREFIX}status after {seconds(running_s)}, {instances} instance{'s' if instances != 1 else ''}"
    if not reported(list(figures)):
        return f"{head}: no progress reported yet"
    lines = [f"{head}:", *rows(figures, now)]
    for f in sorted(figures, key=lambda f: f.instance):
        if f.pending is not None:
            call = f.pending
            lines.append(
                f"{PREFIX}instance {f.instance} is in collective #{call.seq} {call.kind} "
                f"{call.name!r} for {seconds(max(0.0, now - call.started))}"
            )
    found = slowest(figures)
    if found is not None and found.worth_naming:
        lines.append(found.line())
    return "\n".join(lines)
