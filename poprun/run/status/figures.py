"""What the status views read of one instance's progress, and the figures derived from it.

The progress board (:mod:`poprun.run.progress`) keeps one record per instance; the views
(the straggler table, the Prometheus metrics, the JSON) read only the fields named by
:class:`Figures`, so they are tested with made-up records and never depend on how the
board is filled. The derived figures are defined once here, so the table, ``/metrics`` and
``/status`` never disagree on what "waiting share" or "samples/s" means. Each is taken over
the instance's *span*: from the launch (poprun's clock) to its last progress, or to now
while the job runs. The span, not the steps' time, because an instance's own work is not
all inside its steps: a slow data loader works between them, and the instance that waits
for it waits inside its step's collective.

- *waiting share*: the part of the span spent waiting in collectives;
- *own work*: the rest of the span (computing, loading data, starting up). In a data-parallel
  job every instance goes at the pace of the slowest, so their spans are alike and the
  straggler shows as the one with the least waiting.
"""

from __future__ import annotations

from typing import Protocol


class Call(Protocol):
    """A collective an instance has started and not yet finished."""

    @property
    def seq(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def started(self) -> float: ...


class Figures(Protocol):
    """One instance's progress as the board last heard it (times: poprun's monotonic clock)."""

    @property
    def instance(self) -> int: ...
    @property
    def host(self) -> str: ...
    @property
    def steps(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def step_time_s(self) -> float: ...
    @property
    def wait_s(self) -> float: ...
    @property
    def collectives(self) -> int: ...
    @property
    def bytes_reduced(self) -> int: ...
    @property
    def rss_bytes(self) -> int: ...
    @property
    def rss_peak_bytes(self) -> int: ...
    @property
    def last_progress(self) -> float: ...
    @property
    def reported_at(self) -> float: ...
    @property
    def pending(self) -> Call | None: ...


def span_s(figures: Figures, started: float, now: float | None = None) -> float:
    """Seconds from the launch to where the instance's ``wait_s`` was measured (``now``, live).

    An instance's last record counts the wait it is in up to the moment the record was made
    (``reported_at``), which is later than its last progress when it ends blocked (a hang, a
    kill in a collective): the span ends there too, so waiting never exceeds the span.
    """
    end = max(figures.last_progress, figures.reported_at)
    if now is not None:
        end = max(now, end)
    return max(0.0, end - started)


def wait_share(figures: Figures, span: float) -> float | None:
    """The share of ``span`` spent waiting in collectives, 0..1; None for an empty span."""
    if span <= 0:
        return None
    return min(1.0, max(0.0, figures.wait_s / span))


def own_work_s(figures: Figures, span: float) -> float:
    """Seconds of ``span`` not spent waiting in collectives."""
    return max(0.0, span - figures.wait_s)


def samples_per_s(figures: Figures, span: float) -> float | None:
    """Samples a second over ``span``; None before the first sample."""
    if span <= 0 or figures.samples <= 0:
        return None
    return figures.samples / span


def progress_age_s(figures: Figures, now: float) -> float:
    """Seconds since the instance last made progress (poprun's monotonic clock)."""
    return max(0.0, now - figures.last_progress)


def reported(figures: list[Figures]) -> bool:
    """Whether any instance has reported progress (a step or a collective)."""
    return any(f.steps > 0 or f.collectives > 0 for f in figures)


def size(nbytes: int) -> str:
    """``nbytes`` for a reader: 512 B, 3.0 KiB, 312 MiB, 1.25 GiB."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def seconds(value: float) -> str:
    """A duration for a reader: 850 µs, 41.2 ms, 3.20 s, 95 s."""
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    if value < 10:
        return f"{value:.2f} s"
    return f"{value:.0f} s"
