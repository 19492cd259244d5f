"""A pytest plugin: how long each tier took (``make test`` loads it: ``-p tests.support.tier_times``).

A tier is the folder under ``tests/`` a test lives in; its time is the sum of its tests' set-up,
call and tear-down (module fixtures included), which is its share of the run's wall clock since
tests run one after another. The rest (start-up, collection) is shown on a line of its own.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

_seconds: defaultdict[str, float] = defaultdict(float)
_tests: defaultdict[str, set[str]] = defaultdict(set)
_start = [time.monotonic()]


def tier_of(nodeid: str) -> str:
    """``tests/unit/test_x.py::test_y`` → ``unit``."""
    parts = nodeid.split("::", 1)[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else parts[0]


def pytest_sessionstart(session: pytest.Session) -> None:
    _start[0] = time.monotonic()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = tier_of(report.nodeid)
    _seconds[tier] += report.duration
    _tests[tier].add(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds:
        return
    total = time.monotonic() - _start[0]
    terminalreporter.write_sep("=", "time per tier")
    for tier, seconds in sorted(_seconds.items(), key=lambda kv: -kv[1]):
        count = len(_tests[tier])
        terminalreporter.write_line(f"{tier:<12} {seconds:8.1f} s  {count:5d} tests")
    rest = max(0.0, total - sum(_seconds.values()))
    terminalreporter.write_line(f"{'(start-up)':<12} {rest:8.1f} s")
    terminalreporter.write_line(f"{'all':<12} {total:8.1f} s")
