"""JobOutput: what the supervisor's result record learns from the job's output (no process)."""

from __future__ import annotations

import pytest

from popdist.error_record import record_line
from poprun.config.run_config import RunConfig
from poprun.plan.topology import plan
from poprun.run.output.router import JobOutput
from poprun.run.verdict import RunResult, decide

pytestmark = pytest.mark.unit


def _output(aborts: list[int], pids: list[tuple[int, int]]) -> JobOutput:
    config = RunConfig(program=("p",), num_instances=3, num_replicas=3, only_output_from_instance=2)
    return JobOutput(
        config,
        plan(config),
        on_pid=lambda i, p: pids.append((i, p)),
        on_abort=lambda: aborts.append(1),
    )


def test_pids_records_tracebacks_and_the_abort_reach_the_result(
    capsys: pytest.CaptureFixture[str],
) -> None:
    aborts: list[int] = []
    pids: list[tuple[int, int]] = []
    out = _output(aborts, pids)
    out.on_instance(0, "stderr", b"\x1fpoprun-pid=40\nTraceback (most recent call last):\n")
    out.on_instance(0, "stderr", b"OSError: disk full\n")
    fields = {"instance": 1, "host": "h", "pid": 41, "type": "ValueError", "message": "m"}
    out.on_instance(1, "stderr", b"\x1fpoprun-pid=41\n")
    out.on_instance(1, "stderr", record_line({**fields, "traceback": "tb\n"}).encode())
    out.on_instance(1, "stdout", b"instance 1 was here\n")
    out.on_untagged(b"Primary job  terminated normally, but 1 process returned\n")
    out.on_untagged(b"Primary job  terminated normally, but 1 process returned\n")
    out.close()
    assert pids == [(0, 40), (1, 41)] and aborts == [1]
    first, second, third = out.results()
    assert first.pid == 40 and first.error is None and first.raised_at is not None
    assert first.stderr_tail == ("Traceback (most recent call last):", "OSError: disk full")
    assert second.error is not None and second.error.type == "ValueError"
    assert second.stderr_tail == ()  # the record is data, not a stderr line
    assert second.raised_at is not None and second.raised_at > first.raised_at
    assert third.pid is None and third.raised_at is None
    # Instance 0's traceback came first: it is the root cause, reported from its stderr tail.
    code, report = decide(RunResult(out.results(), returncode=1, exited_at_abort=(1,)))
    assert code == 1 and report.startswith("poprun: instance 0 failed first")
    assert "    OSError: disk full" in report
    assert "Primary job" not in capsys.readouterr().err  # mpirun's note was swallowed


def test_mpirun_losing_a_daemon_is_told_once(capsys: pytest.CaptureFixture[str]) -> None:
    """mpirun's words for a lost daemon (a crashed host) tell the membership to ask every
    host at once; they are no abort of the job's own, and the user still sees them."""
    lost: list[int] = []
    out = _output([], [])
    out.on_daemon_lost = lambda: lost.append(1)
    out.on_untagged(b"An MPI communication peer process has unexpectedly disconnected.\n")
    assert lost == []
    out.on_untagged(b"ORTE has lost communication with a remote daemon.\n")
    out.on_untagged(b"ORTE has lost communication with a remote daemon.\n")
    assert lost == [1] and not out.messages.aborting
    assert "lost communication" in capsys.readouterr().err
