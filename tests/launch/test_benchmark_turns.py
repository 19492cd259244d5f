"""benchmarks/_turns.py: jobs launched side by side time their blocks in turn, never at once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _turns import TurnJob, take_turns  # noqa: E402

pytestmark = pytest.mark.launch

#: A job of one rank that logs the start and end of each turn (``--turns DIR`` comes last).
JOB = """
import os, sys, time
sys.path.insert(0, {bench!r})
from allreduce_worker import Turns
name, log, fail_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
turns = Turns(sys.argv[-1], 0)
for k in range({turns}):
    turns.begin()
    with open(log, "a") as f:
        f.write(f"{{name}} start {{time.monotonic_ns()}}\\n")
    if k == fail_after:
        sys.exit(3)
    time.sleep(0.01)  # work inside the turn: another job's turn must not overlap it
    with open(log, "a") as f:
        f.write(f"{{name}} end {{time.monotonic_ns()}}\\n")
    turns.end()
turns.begin()  # the last turn: report and exit
print(f"{{name}} reports", flush=True)
"""


def _jobs(tmp_path: Path, turns: int, fail: dict[str, int]) -> dict[str, TurnJob]:
    script = JOB.format(bench=str(ROOT / "benchmarks"), turns=turns)
    log = tmp_path / "log"
    return {
        name: TurnJob(
            [sys.executable, "-c", script, name, str(log), str(fail.get(name, -1))],
            dict(os.environ),
            tmp_path,
            1,
        )
        for name in ("a", "b")
    }


def test_jobs_take_turns_in_a_rotating_order_and_report_one_at_a_time(tmp_path: Path) -> None:
    outputs = take_turns(_jobs(tmp_path, 4, {}), 4, timeout_s=120)
    assert outputs == {"a": "a reports\n", "b": "b reports\n"}
    events = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    starts = [name for name, what, _ in events if what == "start"]
    assert starts == ["a", "b", "b", "a", "a", "b", "b", "a"]  # the order rotates each pass
    # Each start is followed by the same job's end before any other job starts: no overlap.
    assert [(e[0], e[1]) for e in events] == [(n, w) for n in starts for w in ("start", "end")]


def test_a_job_that_fails_is_named_and_the_other_is_ended(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path, 4, {"b": 1})
    with pytest.raises(RuntimeError, match=r"^b stopped taking turns \(exit 3\)"):
        take_turns(jobs, 4, timeout_s=120)
    for job in jobs.values():
        assert job.proc is not None and job.proc.poll() is not None  # nothing survives
