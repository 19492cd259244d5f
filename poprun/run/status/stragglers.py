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

from poprun import summary as brief  # (this module's summary() is the live table)
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


def _row(f: Figures, started: float, now: float | None) -> list[str]:
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
    return row


def split(
    figures: Sequence[Figures], started: float, now: float | None = None
) -> tuple[list[Figures], list[Figures]]:
    """(shown, rest): every instance by index, or past :data:`poprun.summary.THRESHOLD`
    the :data:`poprun.summary.TOP` with the most own work (the slowest first) and the rest."""
    ordered = sorted(figures, key=lambda f: f.instance)
    if not brief.summarised(len(ordered)):
        return ordered, []
    spans = {f.instance: span_s(f, started, now) for f in ordered}
    by_work = sorted(ordered, key=lambda f: (-own_work_s(f, spans[f.instance]), f.instance))
    return by_work[: brief.TOP], sorted(by_work[brief.TOP :], key=lambda f: f.instance)


def rest_summary(rest: Sequence[Figures], started: float, now: float | None) -> dict[str, str]:
    """The instances not shown one by one: who they are, and each figure's spread."""
    shares = [wait_share(f, span_s(f, started, now)) for f in rest]
    out = {
        "instances": f"{brief.ranges(f.instance for f in rest)} ({len(rest):,})",
        "hosts": brief.hosts((f.host for f in rest), most=2),
        "steps": brief.spread([f.steps for f in rest], lambda v: f"{v:.0f}"),
        "step_time": brief.spread([f.step_time_s for f in rest if f.steps > 0], seconds),
        "waiting": brief.spread([x for x in shares if x is not None], lambda v: f"{v:.0%}"),
        "peak_rss": brief.spread(
            [f.rss_peak_bytes for f in rest if f.rss_peak_bytes > 0], lambda v: size(int(v))
        ),
    }
    if now is not None:
        ages = [progress_age_s(f, now) for f in rest]
        out["last_progress"] = brief.spread(ages, seconds) + " ago"
    return out


def rows(figures: Sequence[Figures], started: float, now: float | None = None) -> list[str]:
    """The table's lines, aligned (``now``: live, with the "last progress" age column): a
    row per instance, or past :data:`poprun.summary.THRESHOLD` of them the
    :data:`poprun.summary.TOP` with the most own work, then one row for the rest."""
    header = ["instance", "host", "steps", "step time", "waiting", "peak RSS"]
    shown, rest = split(figures, started, now)
    body = [_row(f, started, now) for f in shown]
    if rest:
        cells = rest_summary(rest, started, now)
        body.append([f"{len(rest):,} more", *list(cells.values())[1:]])
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
#: ... and past the threshold, which rows the table has.
SUMMED = "; the {top} with the most own work, then the others' spread (median)"


def _title(n: int) -> str:
    more = SUMMED.format(top=brief.TOP) if brief.summarised(n) else ""
    return PREFIX + TITLE.format(n=f"{n:,}") + more + ":"


def report(figures: Sequence[Figures], started: float) -> str:
    """What poprun prints at the end of a run: "" for one instance or when none reported.

    ``started``: when the job was launched (poprun's monotonic clock)."""
    if len(figures) < 2 or not reported(list(figures)):
        return ""
    lines = [_title(len(figures)), *rows(figures, started)]
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
    more = SUMMED.format(top=brief.TOP) if brief.summarised(len(figures)) else ""
    pending = [PREFIX + line for line in in_collectives(figures, now)]
    lines = [f"{head}{more}:", *rows(figures, started, now), *pending]
    found = slowest(figures, started, now)
    if found is not None and found.worth_naming:
        lines.append(found.line())
    return "\n".join(lines)


def in_collectives(figures: Sequence[Figures], now: float) -> list[str]:
    """Who is in which collective: a line per instance, or past the threshold a line per
    collective (its instances' ranges and how long they have been in it)."""
    waiting = sorted((f for f in figures if f.pending is not None), key=lambda f: f.instance)
    if not brief.summarised(len(waiting)):
        lines = []
        for f in waiting:
            call = f.pending
            assert call is not None
            lines.append(
                f"instance {f.instance} is in collective #{call.seq} {call.kind} "
                f"{call.name!r} for {seconds(max(0.0, now - call.started))}"
            )
        return lines
    calls: dict[tuple[int, str, str], list[Figures]] = {}
    for f in waiting:
        call = f.pending
        assert call is not None
        calls.setdefault((call.seq, call.kind, call.name), []).append(f)
    lines = []
    for (seq, kind, name), group in list(calls.items())[: brief.TOP]:
        ages = [max(0.0, now - f.pending.started) for f in group if f.pending is not None]
        lines.append(
            f"{brief.count(len(group), 'instance')} "
            f"({brief.ranges(f.instance for f in group)}) are in collective #{seq} {kind} "
            f"{name!r} for {brief.spread(ages, seconds)}"
        )
    if len(calls) > brief.TOP:
        lines.append(f"… and {brief.count(len(calls) - brief.TOP, 'more collective')}")
    return lines
