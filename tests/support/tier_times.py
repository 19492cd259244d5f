"""A pytest plugin: how long each tier took (``make test`` loads it: ``-p tests.support.tier_times``).

A tier is the folder under ``tests/`` a test lives in. Its time is the wall-clock time during
which at least one of its tests was in set-up, call or tear-down (module and session fixtures
included): the union of those intervals. Run one test after another, that is the sum of its
tests' times; run on several pytest-xdist workers side by side (``make test`` does), tiers
overlap, so their times add up to more than the whole run. Each row also gives the tests' own
time summed (the work the tier's tests did, whichever worker ran them). The rest of the run
(start-up, collection, workers' start) is shown on a line of its own.

Under xdist the controller gets every worker's reports, with their start and stop times.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

_seconds: defaultdict[str, float] = defaultdict(float)
_spans: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)
_tests: defaultdict[str, set[str]] = defaultdict(set)
_start = [time.time()]


def tier_of(nodeid: str) -> str:
    """``tests/unit/test_x.py::test_y`` → ``unit``."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals ``spans`` (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def pytest_sessionstart(session: pytest.Session) -> None:
    _start[0] = time.time()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = tier_of(report.nodeid)
    _seconds[tier] += report.duration
    _tests[tier].add(report.nodeid)
    stop = report.stop if report.stop else time.time()
    start = report.start if report.start else stop - report.duration
    _spans[tier].append((start, stop))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds or hasattr(terminalreporter.config, "workerinput"):
        return  # nothing ran, or an xdist worker (the controller prints the summary)
    total = time.time() - _start[0]
    workers = getattr(terminalreporter.config.option, "numprocesses", None) or 1
    terminalreporter.write_sep("=", f"time per tier ({workers} worker{'s' * (workers > 1)})")
    terminalreporter.write_line(f"{'tier':<12} {'wall':>8}    {'tests own':>9}  {'tests':>5}")
    walls = {tier: covered(spans) for tier, spans in _spans.items()}
    for tier, wall in sorted(walls.items(), key=lambda kv: -kv[1]):
        count = len(_tests[tier])
        own = _seconds[tier]
        terminalreporter.write_line(f"{tier:<12} {wall:8.1f} s  {own:9.1f} s  {count:5d}")
    every = [span for spans in _spans.values() for span in spans]
    rest = max(0.0, total - covered(every))
    terminalreporter.write_line(f"{'(start-up)':<12} {rest:8.1f} s")
    terminalreporter.write_line(f"{'all':<12} {total:8.1f} s")
