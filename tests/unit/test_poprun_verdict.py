"""The supervisor's decisions: a result record → poprun's exit code and report (pure)."""

from __future__ import annotations

import io
import signal

import pytest

from popdist import error_record
from poprun.run.evidence import ErrorRecord, Failure
from poprun.run.output.instance_stream import InstanceStream
from poprun.run.verdict import InstanceResult, RunResult, decide

pytestmark = pytest.mark.unit

TAIL = ("step 3", "something went wrong on 1")


def _instances(n: int = 3, **changes: dict[str, object]) -> tuple[InstanceResult, ...]:
    """``n`` local instances with pids 100+i; ``changes`` maps "i<index>" to field values."""
    out = []
    for i in range(n):
        fields: dict[str, object] = {"index": i, "host": "localhost", "pid": 100 + i}
        fields.update(changes.get(f"i{i}", {}))
        out.append(InstanceResult(**fields))  # type: ignore[arg-type]
    return tuple(out)


def _record(instance: int, kind: str = "RuntimeError", message: str = "boom") -> ErrorRecord:
    return ErrorRecord(
        type=kind,
        message=message,
        traceback=f'Traceback (most recent call last):\n  File "t.py"\n{kind}: {message}\n',
        pid=100 + instance,
        host="localhost",
        instance=instance,
    )


def test_all_ok() -> None:
    assert decide(RunResult(_instances(), returncode=0)) == (0, "")


def test_mpirun_could_not_start() -> None:
    code, report = decide(RunResult(_instances(), returncode=None, launch_error="No such file"))
    assert code == 1 and report == "poprun: cannot start mpirun: No such file"


def test_first_failure_named_by_mpirun_reports_its_code_and_stderr_tail() -> None:
    result = RunResult(
        _instances(i1={"stderr_tail": TAIL}),
        returncode=3,
        mpirun_failure=Failure(1, exit_code=3),
        exited_at_abort=(1,),
    )
    code, report = decide(result)
    assert code == 3
    assert report.splitlines() == [
        "poprun: instance 1 failed first: exit code 3 (host localhost, pid 101)",
        "poprun: last 2 lines of instance 1's stderr:",
        "    step 3",
        "    something went wrong on 1",
        "poprun: ended every other instance of the job; exit code 3",
    ]


def test_failure_by_signal_exits_128_plus_n() -> None:
    result = RunResult(_instances(), returncode=137, mpirun_failure=Failure(2, signal=9))
    code, report = decide(result)
    assert code == 137
    assert "instance 2 failed first: killed by signal 9 (SIGKILL)" in report
    assert "instance 2 wrote nothing to stderr" in report


def test_abort_without_a_named_process_blames_the_last_instance_to_end() -> None:
    result = RunResult(_instances(), returncode=5, exited_at_abort=(0, 2))
    code, report = decide(result)
    assert code == 5 and "instance 2 failed first: exit code 5" in report


@pytest.mark.parametrize(("returncode", "expected"), [(0, 1), (-9, 1)])
def test_unknown_status(returncode: int, expected: int) -> None:
    # mpirun was ended before it said how the instance ended: exit 1, and say so.
    result = RunResult(_instances(), returncode=returncode, exited_at_abort=(0,))
    code, report = decide(result)
    assert code == expected
    assert "instance 0 failed first: ended first (mpirun was stopped before" in report


def test_status_known_but_not_given_uses_mpiruns_code() -> None:
    result = RunResult(_instances(), returncode=7, mpirun_failure=Failure(1))
    code, report = decide(result)
    assert code == 7 and "exited without finishing MPI" in report


def test_error_record_is_the_report_and_names_the_root_cause() -> None:
    # Instance 0 ended first (Horovod shut it down), but instance 1 raised first.
    result = RunResult(
        _instances(
            i0={"raised_at": 2.0, "error": _record(0, "HorovodInternalError", "peer gone")},
            i1={"raised_at": 1.0, "error": _record(1), "stderr_tail": TAIL},
        ),
        returncode=1,
        mpirun_failure=Failure(0, exit_code=1),
    )
    code, report = decide(result)
    assert code == 1
    lines = report.splitlines()
    assert lines[0] == "poprun: instance 1 failed first: exit code 1 (host localhost, pid 101)"
    assert lines[1] == "poprun: instance 1 raised RuntimeError: boom"
    assert "    RuntimeError: boom" in lines
    assert "something went wrong" not in report  # the record replaces the stderr tail


def test_traceback_without_record_still_names_the_root_cause() -> None:
    result = RunResult(
        _instances(i2={"raised_at": 1.0, "stderr_tail": TAIL}),
        returncode=1,
        mpirun_failure=Failure(0, exit_code=1),
    )
    code, report = decide(result)
    assert code == 1 and report.startswith("poprun: instance 2 failed first: exit code 1")
    assert "last 2 lines of instance 2's stderr" in report


SHUT_DOWN = "Horovod has been shut down. This was caused by an exception on one of the ranks"


@pytest.mark.parametrize("with_records", [True, False])
def test_a_peers_echo_that_arrived_first_is_not_the_root_cause(with_records: bool) -> None:
    # Across hosts: instance 0 (here) echoes the shutdown before instance 2's own exception
    # (remote) reaches poprun, and mpirun saw instance 0 end first.
    echo = ("Traceback (most recent call last):", f"HorovodInternalError: {SHUT_DOWN}")
    cause = ("Traceback (most recent call last):", "RuntimeError: boom")
    i0: dict[str, object] = {"raised_at": 1.0, "stderr_tail": echo}
    i2: dict[str, object] = {"raised_at": 1.2, "stderr_tail": cause, "host": "node2"}
    if with_records:
        i0["error"] = _record(0, "horovod.common.exceptions.HorovodInternalError", SHUT_DOWN)
        i2["error"] = _record(2)
    result = RunResult(
        _instances(i0=i0, i2=i2), returncode=1, mpirun_failure=Failure(0, exit_code=1)
    )
    code, report = decide(result)
    assert code == 1
    assert report.startswith("poprun: instance 2 failed first: exit code 1 (host node2, pid 102)")


def test_an_echo_alone_is_still_reported() -> None:
    echo = (f"HorovodInternalError: {SHUT_DOWN}",)
    result = RunResult(
        _instances(i1={"raised_at": 1.0, "stderr_tail": echo}),
        returncode=1,
        mpirun_failure=Failure(0, exit_code=1),
    )
    code, report = decide(result)
    assert code == 1 and report.startswith("poprun: instance 1 failed first: exit code 1")


def test_remote_failure_mpirun_did_not_name_still_gets_a_report() -> None:
    instances = (*_instances(2), InstanceResult(2, "node1"), InstanceResult(3, "node1"))
    code, report = decide(RunResult(instances, returncode=7, exited_at_abort=(), remote=(2, 3)))
    assert code == 7
    assert report.splitlines() == [
        "poprun: an instance on another host failed first with exit code 7; mpirun did not "
        "say which (instances on other hosts: 2 (node1), 3 (node1))",
        "poprun: ended every other instance of the job; exit code 7",
    ]
    # One host: nothing to add to mpirun's own words.
    assert decide(RunResult(_instances(2), returncode=7, exited_at_abort=())) == (7, "")


def test_remote_instance_record_without_mpirun_note() -> None:
    # A remote instance: no local pid, and mpirun's wording gave nothing; the record says it all.
    record = ErrorRecord("ValueError", "bad shard", "ValueError: bad shard\n", 4242, "node1", 1)
    instances = (
        InstanceResult(0, "node0"),
        InstanceResult(1, "node1", error=record, raised_at=3.0),
    )
    code, report = decide(RunResult(instances, returncode=1))
    assert code == 1
    assert report.splitlines()[:2] == [
        "poprun: instance 1 failed first: exit code 1 (host node1, pid 4242)",
        "poprun: instance 1 raised ValueError: bad shard",
    ]


def test_escalation_is_reported_and_keeps_the_failures_code() -> None:
    result = RunResult(
        _instances(), returncode=3, mpirun_failure=Failure(1, exit_code=3), escalated=True
    )
    code, report = decide(result)
    assert code == 3
    assert report.endswith("poprun: the job did not end by itself in time: poprun sent SIGKILL")


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal(sig: int, code: int) -> None:
    # A forwarded signal wins over whatever the instances did as they ended.
    result = RunResult(
        _instances(), returncode=1, signals=(sig,), mpirun_failure=Failure(0, exit_code=1)
    )
    assert decide(result) == (
        code,
        f"poprun: received {signal.Signals(sig).name}; ended the job; exit code {code}",
    )


def test_double_signal() -> None:
    result = RunResult(_instances(), returncode=-9, signals=(signal.SIGINT, signal.SIGTERM))
    assert decide(result) == (
        130,
        "poprun: received SIGINT, then SIGTERM: killed the job at once; exit code 130",
    )


def test_time_out_names_the_running_instances_local_and_remote() -> None:
    instances = (*_instances(2), InstanceResult(2, "node1"))
    result = RunResult(
        instances, returncode=-15, timeout=1.5, timed_out=True, still_running=(1, 2), escalated=True
    )
    code, report = decide(result)
    assert code == 124
    assert report.splitlines() == [
        "poprun: --timeout=1.5 s expired; instances still running: "
        "1 (host localhost, pid 101), 2 (host node1, pid unknown)",
        "poprun: ended the job; exit code 124",
    ]


def test_mpirun_killed_by_a_signal_without_a_failure_is_said() -> None:
    code, report = decide(RunResult(_instances(), returncode=-9, mpirun_pid=4321))
    assert code == 137
    assert report == (
        "poprun: mpirun (pid 4321) was killed by SIGKILL before the job ended; its instances "
        "were ended too; exit code 137"
    )
    # poprun killed it itself (the escalation): that is reported where it happened
    assert decide(RunResult(_instances(), returncode=-9, mpirun_killed_by_poprun=True)) == (137, "")


def test_what_the_instances_left_behind_is_reported_even_on_success() -> None:
    code, report = decide(RunResult(_instances(), returncode=0, left_behind=("77 (sleep)",)))
    assert code == 0
    assert report.startswith("poprun: killed what the instances left behind: 77 (sleep)")


def test_plain_nonzero_mpirun_exit_passes_through() -> None:
    assert decide(RunResult(_instances(), returncode=2)) == (2, "")


# --- the record travels in the instance's stderr ------------------------------------------------


def test_record_line_round_trips_and_is_taken_out_of_the_output() -> None:
    try:
        raise KeyError("missing\nkey")
    except KeyError as exc:
        fields = error_record.record(
            KeyError, exc, exc.__traceback__, {"POPDIST_INSTANCE_INDEX": "3", "POPDIST_HOST": "h"}
        )
    line = error_record.record_line(fields).encode()
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    console, copy = io.BytesIO(), io.BytesIO()
    records: list[tuple[int, ErrorRecord | None]] = []
    stream = InstanceStream(
        3,
        "stderr",
        console,  # type: ignore[arg-type]
        copy,  # type: ignore[arg-type]
        on_record=lambda i, raw: records.append((i, ErrorRecord.from_line(raw))),
    )
    for part in (b"before\n", line[:10], line[10:], b"after"):
        stream.feed(part)
    stream.close()
    assert console.getvalue() == b"[1,3]<stderr>:before\n[1,3]<stderr>:after\n"
    assert copy.getvalue() == b"before\nafter"
    assert stream.tail_text() == ["before", "after"]
    [(index, record)] = records
    assert index == 3 and record is not None
    assert (record.type, record.message, record.instance, record.host) == (
        "KeyError",
        "'missing\\nkey'",
        3,
        "h",
    )
    assert "raise KeyError" in record.traceback


@pytest.mark.parametrize(
    "line", [b"\x1fpopdist-error={not json\n", b"\x1fpopdist-error=[1]\n", b"plain\n"]
)
def test_a_malformed_record_is_not_a_record(line: bytes) -> None:
    assert ErrorRecord.from_line(line) is None
