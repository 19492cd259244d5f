"""The per-instance table and the straggler (pure): printed at the end of a multi-instance run
and, live, on the summary signal.

In a data-parallel job every step ends in a collective, so every instance goes at the pace of
the slowest one, and the slow instance does not show in the step times (its own may even be
the shortest: its slow part, a data loader say, may lie between its steps). It shows in the
waiting: the others finish their own work first and wait in the collective for it. So the
straggler is the instance with the most *own work* (its span less its waiting,
:mod:`poprun.run.status.figures`), and what it cost the others is their waiting beyond its
own, measured, not inferred: each other instance's waiting time less the straggler's (the
straggler waits only for the reduction itself).

It is named only when the spread is worth a user's attention, both:

- its own work exceeds the median of the others' by at least :data:`SPREAD` (10 %):
  instances doing the same work differ by a few percent from scheduling and caches alone,
  and naming one for that would be noise;
- the others lost at least :data:`COST` (5 %) of their time waiting for it: a straggler that
  costs the job less is not worth acting on, even when relatively slow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from poprun.run.status.figures import (
    Figures,
    own_work_s,
    progress_age_s,
    reported,
    seconds,
    size,
    span_s,
    wait_share,
)

#: The slowest instance's own work must exceed the others' median by this share...
SPREAD = 0.10
#: ... and the others must have spent this share of their time waiting for it.
COST = 0.05

PREFIX = "poprun: "


class Straggler(NamedTuple):
    """The instance that held the others up, and what it cost them."""

    instance: int
    host: str
    #: Its own work (seconds of its span not spent waiting), and the median of the others'.
    own_s: float
    others_own_s: float
    #: The others' waiting beyond the straggler's, added up over them (seconds) ...
    cost_s: float
    #: ... a step, per other instance (None when they have not stepped) ...
    cost_per_step_s: float | None
    #: ... and as a share of the others' time.
    cost_share: float

    @property
    def spread(self) -> float:
        """How much more own work than the others' median (0.5: 50 % more)."""
        if self.others_own_s <= 0:
            return float("inf") if self.own_s > 0 else 0.0
        return self.own_s / self.others_own_s - 1.0

    @property
    def worth_naming(self) -> bool:
        """Both thresholds met (see the module's docstring for why these)."""
        return self.spread >= SPREAD and self.cost_share >= COST

    def line(self) -> str:
        """One sentence naming it and its cost."""
        step = f", {seconds(self.cost_per_step_s)} a step" if self.cost_per_step_s else ""
        return (
            f"{PREFIX}instance {self.instance} ({self.host}) held the others up: they waited "
            f"{seconds(self.cost_s)} in all for it in collectives "
            f"({self.cost_share:.0%} of their time{step})"
        )


def slowest(
    figures: Sequence[Figures], started: float, now: float | None = None
) -> Straggler | None:
    """The instance with the most own work and its cost to the others; None with fewer than
    two instances that reported progress."""
    import statistics  # here, not at the top: it costs every launch ~5 ms (decimal, fractions)

    active = [f for f in figures if (f.steps > 0 or f.collectives > 0)]
    spans = {f.instance: span_s(f, started, now) for f in active}
    active = [f for f in active if spans[f.instance] > 0]
    if len(active) < 2:
        return None

    def own(f: Figures) -> float:
        return own_work_s(f, spans[f.instance])

    worst = max(active, key=lambda f: (own(f), -f.instance))
    others = [f for f in active if f is not worst]
    extra = [max(0.0, f.wait_s - worst.wait_s) for f in others]
    cost = sum(extra)
    others_span = sum(spans[f.instance] for f in others)
    stepped = [(e, f.steps) for e, f in zip(extra, others, strict=True) if f.steps > 0]
    return Straggler(
        instance=worst.instance,
        host=worst.host,
        own_s=own(worst),
        others_own_s=statistics.median(own(f) for f in others),
        cost_s=cost,
        cost_per_step_s=statistics.mean(e / n for e, n in stepped) if stepped else None,
        cost_share=cost / others_span if others_span > 0 else 0.0,
    )


def _waiting(f: Figures, span: float) -> str:
    share = wait_share(f, span)
    if share is None:
        return seconds(f.wait_s) if f.wait_s > 0 else "-"
    return f"{share:.0%} ({seconds(f.wait_s)})"


def rows(figures: Sequence[Figures], started: float, now: float | None = None) -> list[str]:
    """The table's lines, aligned (``now``: live, with the "last progress" age column)."""
    header = ["instance", "host", "steps", "step time", "waiting", "peak RSS"]
    body = []
    for f in sorted(figures, key=lambda f: f.instance):
        row = [
            str(f.instance),
            f.host,
            str(f.steps),
            seconds(f.step_time_s) if f.steps > 0 else "-",
            _waiting(f, span_s(f, started, now)),
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


TITLE = "progress of the {n} instances (step time: mean; waiting: in collectives, share of the run)"


def report(figures: Sequence[Figures], started: float) -> str:
    """What poprun prints at the end of a run: "" for one instance or when none reported.

    ``started``: when the job was launched (poprun's monotonic clock)."""
    if len(figures) < 2 or not reported(list(figures)):
        return ""
    lines = [PREFIX + TITLE.format(n=len(figures)) + ":", *rows(figures, started)]
    found = slowest(figures, started)
    if found is not None and found.worth_naming:
        lines.append(found.line())
    return "\n".join(lines)


def summary(figures: Sequence[Figures], now: float, *, instances: int, started: float) -> str:
    """The live summary (the summary signal): the table, the pending collectives, the
    straggler when worth naming; a line saying so when nothing was reported yet."""
    plural = "s" if instances != 1 else ""
    head = f"{PREFIX}status after {seconds(max(0.0, now - started))}, {instances} instance{plural}"
    if not reported(list(figures)):
        return f"{head}: no progress reported yet"
    lines = [f"{head}:", *rows(figures, started, now)]
    for f in sorted(figures, key=lambda f: f.instance):
        if f.pending is not None:
            call = f.pending
            lines.append(
                f"{PREFIX}instance {f.instance} is in collective #{call.seq} {call.kind} "
                f"{call.name!r} for {seconds(max(0.0, now - call.started))}"
            )
    found = slowest(figures, started, now)
    if found is not None and found.worth_naming:
        lines.append(found.line())
    return "\n".join(lines)
