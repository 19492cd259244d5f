"""The job's live figures as Prometheus metric families and as JSON (pure, given a snapshot).

The Prometheus text comes from the ``prometheus-client`` library (its metric families and
its exposition), not from hand-written text: the format has escaping and type rules a
scraper enforces. The figures are not kept in the library's own counters: every scrape
reads the board's snapshot afresh through :class:`JobCollector`, so ``/metrics`` and
``/status`` show the same moment, and nothing is updated on the supervisor's path.

Each instance's series carry the labels ``instance`` and ``host``. Counters (``_total``)
only grow within one launch; a relaunch (``--max-restarts``) starts them again, which
Prometheus' ``rate()`` reads as a counter reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from poprun.run.status.figures import (
    Figures,
    own_work_s,
    progress_age_s,
    samples_per_s,
    span_s,
    wait_share,
)

LABELS = ("instance", "host")
#: (name, help, kind, the figure: (figures, span) -> value) of each per-instance series.
SERIES: tuple[tuple[str, str, str, Callable[[Figures, float], float | None]], ...] = (
    ("poprun_instance_steps", "Training steps the instance has finished.", "counter",
     lambda f, span: f.steps),
    ("poprun_instance_samples", "Samples the instance has processed.", "counter",
     lambda f, span: f.samples),
    ("poprun_instance_samples_per_second", "Samples a second since the launch.", "gauge",
     samples_per_s),
    ("poprun_instance_step_seconds", "Mean step time (an executor call).", "gauge",
     lambda f, span: f.step_time_s if f.steps > 0 else None),
    ("poprun_instance_collectives", "Collectives the instance has finished.", "counter",
     lambda f, span: f.collectives),
    ("poprun_instance_reduced_bytes", "Bytes the instance has put into reductions.", "counter",
     lambda f, span: f.bytes_reduced),
    ("poprun_instance_collective_wait_seconds", "Seconds spent waiting in collectives.",
     "counter", lambda f, span: f.wait_s),
    ("poprun_instance_collective_wait_ratio", "Share of the time since the launch spent "
     "waiting in collectives.", "gauge", wait_share),
    ("poprun_instance_own_work_seconds", "Seconds since the launch not spent waiting in "
     "collectives.", "gauge", own_work_s),
    ("poprun_instance_resident_memory_bytes", "Resident set size.", "gauge",
     lambda f, span: f.rss_bytes),
    ("poprun_instance_resident_memory_peak_bytes", "Peak resident set size.", "gauge",
     lambda f, span: f.rss_peak_bytes),
)  # fmt: skip


def families(
    figures: Sequence[Figures], now: float, *, instances: int, started: float
) -> list[Metric]:
    """The metric families of one snapshot (``now``, ``started``: poprun's monotonic clock,
    the moment and the launch)."""
    job = GaugeMetricFamily("poprun_job_instances", "Instances of the job.", value=instances)
    uptime = GaugeMetricFamily(
        "poprun_job_running_seconds", "Seconds since the job was launched.", value=now - started
    )
    out: list[Metric] = [job, uptime]
    ordered = sorted(figures, key=lambda f: f.instance)
    for name, text, kind, read in SERIES:
        family: Metric = (
            CounterMetricFamily(name, text, labels=LABELS)
            if kind == "counter"
            else GaugeMetricFamily(name, text, labels=LABELS)
        )
        for f in ordered:
            value = read(f, span_s(f, started, now))
            if value is not None:
                family.add_metric([str(f.instance), f.host], float(value))  # type: ignore[attr-defined]
        out.append(family)
    age = GaugeMetricFamily(
        "poprun_instance_last_progress_age_seconds",
        "Seconds since the instance last made progress.",
        labels=LABELS,
    )
    pending = GaugeMetricFamily(
        "poprun_instance_pending_collective_seconds",
        "Seconds the instance has been in the collective it has not finished.",
        labels=(*LABELS, "seq", "kind", "name"),
    )
    for f in ordered:
        age.add_metric([str(f.instance), f.host], progress_age_s(f, now))
        if f.pending is not None:
            call = f.pending
            labels = [str(f.instance), f.host, str(call.seq), call.kind, call.name]
            pending.add_metric(labels, max(0.0, now - call.started))
    return [*out, age, pending]


class JobCollector(Collector):
    """A collector that reads the board's snapshot at each scrape."""

    def __init__(self, snapshot: Callable[[], tuple[Sequence[Figures], float, int, float]]):
        #: () -> (figures, now, instances, launch time)
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        figures, now, instances, started = self.snapshot()
        yield from families(figures, now, instances=instances, started=started)


def registry(
    snapshot: Callable[[], tuple[Sequence[Figures], float, int, float]],
) -> CollectorRegistry:
    """A registry of its own (not the library's global one, which an in-process ``main``
    would share between runs) holding the job's collector."""
    own = CollectorRegistry(auto_describe=False)
    own.register(JobCollector(snapshot))
    return own


def text(figures: Sequence[Figures], now: float, *, instances: int, started: float) -> bytes:
    """The Prometheus text exposition of one snapshot."""
    from prometheus_client import generate_latest

    return generate_latest(registry(lambda: (figures, now, instances, started)))


def status_json(
    figures: Sequence[Figures],
    now: float,
    *,
    instances: int,
    started: float,
    every: bool = False,
) -> dict[str, Any]:
    """The same figures as a JSON-ready mapping (``/status``). Past
    :data:`poprun.summary.THRESHOLD` instances (unless ``every``), ``progress`` holds the
    :data:`poprun.summary.TOP` with the most own work and ``summary`` the others' spread and
    who waits in which collective: the page stays readable and a second's message small."""
    from poprun.run.status.stragglers import in_collectives, rest_summary, split

    shown, rest = (
        (sorted(figures, key=lambda f: f.instance), []) if every else split(figures, started, now)
    )
    rows = []
    for f in shown:
        span = span_s(f, started, now)
        pending = None
        if f.pending is not None:
            call = f.pending
            pending = {
                "seq": call.seq,
                "kind": call.kind,
                "name": call.name,
                "for_s": round(max(0.0, now - call.started), 6),
            }
        rows.append(
            {
                "instance": f.instance,
                "host": f.host,
                "steps": f.steps,
                "steps_per_s": f.steps / span if span > 0 else None,
                "samples": f.samples,
                "samples_per_s": samples_per_s(f, span),
                "step_time_s": f.step_time_s if f.steps > 0 else None,
                "own_work_s": own_work_s(f, span),
                "collectives": f.collectives,
                "bytes_reduced": f.bytes_reduced,
                "wait_s": f.wait_s,
                "wait_share": wait_share(f, span),
                "rss_bytes": f.rss_bytes,
                "rss_peak_bytes": f.rss_peak_bytes,
                "last_progress_age_s": round(progress_age_s(f, now), 6),
                "pending": pending,
            }
        )
    out = {"instances": instances, "running_s": round(now - started, 6), "progress": rows}
    if rest:
        out["summary"] = {
            "reported": len(figures),
            "rest": rest_summary(rest, started, now),
            "in_collectives": in_collectives(figures, now),
        }
    return out
