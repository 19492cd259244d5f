"""``IPUStrategy(autoreport=True)``: the run's schedule profile, where Lightning 1.9 had PopVision's.

Lightning 1.x's IPUStrategy asked Poplar for its automatic reports (``autoReport.all``
into ``autoreport_dir``): the compiled graph's memory and execution profile. There is no
Poplar graph here, so what a report can show is what the executor did: when each call
ran, and, for a module split in stages (``BeginBlock``/``Block``), when each stage ran
each micro-batch's forward and backward (popdist_torch's ``record_schedule``). For each
step method the Trainer ran (a "graph": training, validation, test, predict) the report
writes, under ``autoreport_dir`` (``instance<k>/`` first when there are several
instances, which share the directory):

* ``<graph>/schedule.json``: a Chrome trace (``chrome://tracing``, Perfetto): one row of
  executor calls, and one row per stage with its forward and backward operations;
* ``<graph>/profile.json``: the summary: calls, their times (the first one separately:
  it builds the executor, as PopTorch's first call compiles), the replicas, device
  iterations and accumulation the graph ran with, the operations and busy time of each
  stage, the options, and the ``autoreport_options`` as given (recorded; Poplar's
  engine options have nothing to act on here).

The files are written when the Trainer's stage ends (``teardown``), for the graphs that ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import popdist_torch as poptorch
from popdist_torch.pipeline import StageEvent, chrome_trace, record_schedule

__all__ = ["GRAPHS", "AutoReport", "make_report"]

#: The report's folder of each step method.
GRAPHS = {
    "training_step": "training",
    "validation_step": "validation",
    "test_step": "test",
    "predict_step": "predict",
}


@dataclass(frozen=True)
class _Call:
    """One executor call: host start and end (``time.perf_counter``), its stage operations."""

    start: float
    end: float
    events: tuple[StageEvent, ...]


class AutoReport:
    """Records the executor calls of a Trainer stage and writes their report."""

    def __init__(self, directory: Path | None, options: dict[str, Any]) -> None:
        self.directory = directory
        self.options = dict(options)
        self._calls: dict[str, list[_Call]] = {}

    def start(self, default_directory: Path) -> None:
        """A new Trainer stage: forget the calls recorded so far; settle the directory."""
        if self.directory is None:
            self.directory = default_directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self._calls.clear()

    @contextlib.contextmanager
    def call(self, step: str) -> Iterator[None]:
        """Time one executor call of ``step`` and collect its stage operations (if it returns)."""
        with record_schedule() as events:
            start = time.perf_counter()
            yield
            end = time.perf_counter()
        self._calls.setdefault(step, []).append(_Call(start, end, tuple(events)))

    def write(
        self,
        training: poptorch.Options | None,
        inference: poptorch.Options | None,
        rank: int,
        world: int,
    ) -> list[Path]:
        """Write the report of every graph that ran (``training_step`` ran with ``training``,
        the others with ``inference``); the folders written."""
        if self.directory is None:
            return []
        root = self.directory / f"instance{rank}" if world > 1 else self.directory
        written = []
        for step, calls in self._calls.items():
            folder = root / GRAPHS.get(step, step)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "schedule.json").write_text(json.dumps(_trace(calls)))
            opts = training if step == "training_step" else inference
            summary = self._summary(step, calls, opts, rank, world)
            (folder / "profile.json").write_text(json.dumps(summary, indent=2, default=str))
            written.append(folder)
        return written

    def _summary(
        self,
        step: str,
        calls: list[_Call],
        opts: poptorch.Options | None,
        rank: int,
        world: int,
    ) -> dict[str, Any]:
        seconds = [c.end - c.start for c in calls]
        steady = seconds[1:] or seconds
        summary: dict[str, Any] = {
            "report": "popdist_lightning IPUStrategy autoreport (executor schedule)",
            "graph": GRAPHS.get(step, step),
            "step": step,
            "instance": rank,
            "instances": world,
            "calls": len(calls),
            "first_call_seconds": seconds[0],
            "call_seconds": {
                "total": sum(seconds),
                "mean_after_first": sum(steady) / len(steady),
                "min": min(seconds),
                "max": max(seconds),
            },
            "stages": _stages([e for c in calls for e in c.events]),
            "autoreport_options": self.options,
        }
        if opts is not None:
            strategy = opts.execution_strategy
            name = type(strategy).__name__ if strategy is not None else None
            if name is None and summary["stages"]:
                name = "PipelinedExecution"  # PopTorch's default for a module in blocks
            summary.update(
                replicas=opts.replication_factor,
                device_iterations=opts.device_iterations,
                gradient_accumulation=opts.Training.gradient_accumulation,
                execution_strategy=name,
                options=opts.toDict(),
            )
        return summary


def make_report(
    autoreport: bool, directory: str | os.PathLike[str] | None, options: dict[str, Any] | None
) -> AutoReport | None:
    """``IPUStrategy``'s autoreport arguments as a report (``None`` without ``autoreport``).

    A given directory is created at once, as Lightning 1.9 did; without one the report
    goes under the Trainer's ``default_root_dir`` (settled when the Trainer starts).
    """
    if not autoreport:
        return None
    path = Path(directory) if directory is not None else None
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
    return AutoReport(path, options or {})


def _stages(events: list[StageEvent]) -> list[dict[str, Any]]:
    """Per stage: its device, forward and backward operations, and busy seconds."""
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for e in events:
        row = rows.setdefault(
            (e.stage, e.device),
            {
                "stage": e.stage,
                "device": e.device,
                "forward": 0,
                "backward": 0,
                "busy_seconds": 0.0,
            },
        )
        row["forward" if e.kind == "F" else "backward"] += 1
        row["busy_seconds"] += e.end - e.start
    return [rows[key] for key in sorted(rows)]


def _trace(calls: list[_Call]) -> dict[str, Any]:
    """The calls (one host row) and the stages' operations as one Chrome trace."""
    origin = calls[0].start
    events = [e for c in calls for e in c.events]
    host = 1 + max((e.device for e in events), default=-1)  # a row after the devices'
    trace: list[dict[str, Any]] = [
        {
            "name": f"call {i}",
            "cat": "executor call",
            "ph": "X",
            "ts": (c.start - origin) * 1e6,
            "dur": (c.end - c.start) * 1e6,
            "pid": host,
            "tid": 0,
            "args": {"call": i, "stage_operations": len(c.events)},
        }
        for i, c in enumerate(calls)
    ]
    trace.append(
        {"name": "process_name", "ph": "M", "pid": host, "args": {"name": "host: executor calls"}}
    )
    if events:
        shift = (min(e.start for e in events) - origin) * 1e6  # chrome_trace starts at 0
        for entry in chrome_trace(events)["traceEvents"]:
            if entry["ph"] == "X":
                entry["ts"] += shift
            trace.append(entry)
    return {"traceEvents": trace, "displayTimeUnit": "ms"}
