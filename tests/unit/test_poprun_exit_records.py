"""The exit status an instance on another host reports (its wrapper's last stderr line):
parsing, taking it out of the output, its order against mpirun's events, the verdict (pure)."""

from __future__ import annotations

import io
import signal

import pytest

from poprun.config.run_config import RunConfig
from poprun.plan.mpirun import EXIT_MARKER, REMOTE_WRAPPER, WRAPPER
from poprun.plan.topology import plan
from poprun.run.ending import Action, Do, EndingPolicy, Evidence
from poprun.run.evidence import ExitRecord, Failure
from poprun.run.output.instance_stream import InstanceStream
from poprun.run.output.router import JobOutput
from poprun.run.verdict import InstanceResult, RunResult, decide, root_cause

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def _remote(n_local: int = 2, n_remote: int = 2) -> tuple[InstanceResult, ...]:
    local = [InstanceResult(i, "h1", 100 + i) for i in range(n_local)]
    remote = [InstanceResult(n_local + i, "h2", 200 + i) for i in range(n_remote)]
    return (*local, *remote)


# --- the line -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "returncode"),
    [
        (b"\x1fpoprun-exit=7\n", 7),
        (b"\x1fpoprun-exit=0\n", 0),
        (b"\x1fpoprun-exit=-9\n", -9),
        (b"\x1fpoprun-exit=255\r\n", 255),
    ],
)
def test_an_exit_line_is_parsed_popen_style(line: bytes, returncode: int) -> None:
    record = ExitRecord.from_line(line)
    assert record == ExitRecord(returncode)
    assert record.failed is (returncode != 0)


@pytest.mark.parametrize(
    "line",
    [b"\x1fpoprun-exit=\n", b"\x1fpoprun-exit=x\n", b"\x1fpoprun-exit=-99\n", b"exit=7\n"],
)
def test_a_malformed_exit_line_is_not_a_record(line: bytes) -> None:
    assert ExitRecord.from_line(line) is None


def test_an_exit_record_is_a_failure_of_its_instance() -> None:
    assert ExitRecord(7).failure(3) == Failure(3, exit_code=7)
    assert ExitRecord(-9).failure(3) == Failure(3, signal=9)
    assert ExitRecord(-signal.SIGTERM).ended_by_the_job
    assert not ExitRecord(-signal.SIGSEGV).ended_by_the_job
    assert not ExitRecord(143).ended_by_the_job  # an exit code, whatever its value


def test_only_the_remote_wrapper_writes_the_exit_line() -> None:
    assert EXIT_MARKER.replace(b"\x1f", b"\\037").decode() in REMOTE_WRAPPER[2]
    assert "poprun-exit" not in WRAPPER[2]
    assert REMOTE_WRAPPER[-1] == WRAPPER[-1] == "poprun-instance"  # "$0": argv untouched


# --- out of the output --------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 3, 7, 100])
def test_the_exit_line_is_taken_out_of_console_file_and_tail(size: int) -> None:
    console, copy = io.BytesIO(), io.BytesIO()
    seen: list[tuple[int, bytes]] = []
    stream = InstanceStream(
        3,
        "stderr",
        console,
        copy,
        on_pid=lambda i, p: None,
        on_exit=lambda i, line: seen.append((i, line)),
    )
    data = b"\x1fpoprun-pid=9\nfailing\n\x1fpoprun-exit=7\n"
    for start in range(0, len(data), size):
        stream.feed(data[start : start + size])
    stream.close()
    assert seen == [(3, b"\x1fpoprun-exit=7\n")]
    assert console.getvalue() == b"[1,3]<stderr>:failing\n"
    assert copy.getvalue() == b"failing\n"
    assert stream.tail_text() == ["failing"]


def test_an_exit_line_after_a_last_line_without_newline_ends_that_line() -> None:
    console = io.BytesIO()
    seen: list[bytes] = []
    stream = InstanceStream(1, "stderr", console, on_exit=lambda i, line: seen.append(line))
    stream.feed(b"no newline")
    stream.feed(b"\x1fpoprun-exit=2\n")
    stream.close()
    assert seen == [b"\x1fpoprun-exit=2\n"]
    assert console.getvalue() == b"[1,1]<stderr>:no newline\n"
    assert stream.tail_text() == ["no newline"]


def test_stdout_keeps_text_that_looks_like_an_exit_line() -> None:
    console = io.BytesIO()
    stream = InstanceStream(0, "stdout", console)
    stream.feed(b"\x1fpoprun-exit=7\n")
    stream.close()
    assert console.getvalue() == b"[1,0]<stdout>:\x1fpoprun-exit=7\n"


def test_the_router_hands_on_each_instances_first_exit_record() -> None:
    config = RunConfig(program=("p",), num_instances=2, num_replicas=2, only_output_from_instance=1)
    reported: list[tuple[int, ExitRecord]] = []
    out = JobOutput(
        config,
        plan(config),
        on_pid=lambda i, p: None,
        on_abort=lambda: None,
        on_exit=lambda i, record: reported.append((i, record)),
    )
    out.on_instance(1, "stderr", b"\x1fpoprun-pid=5\n\x1fpoprun-exit=7\n")
    out.on_instance(1, "stderr", b"\x1fpoprun-exit=-15\n\x1fpoprun-exit=junk\n")
    out.close()
    assert reported == [(1, ExitRecord(7))]


# --- order against mpirun's events, and the verdict ----------------------------------------


def test_a_record_after_mpirun_exited_and_before_the_streams_end_names_the_instance() -> None:
    # The case mpirun leaves its box out of: a remote instance fails at the start; mpirun
    # announces the abort, exits, and the instance's last line comes after.
    policy = EndingPolicy(Clock(), remote=True)
    policy.launched()
    policy.mpirun_aborting()
    assert _dos(policy.mpirun_exited(7)) == [Do.DRAIN]
    assert policy.reading  # the output has not ended: the record may still come
    policy.exit_reported(3, ExitRecord(7))
    policy.exit_reported(2, ExitRecord(-signal.SIGTERM))  # mpirun ended it
    assert _dos(policy.streams_closed()) == [Do.STOP_READING]
    ending = policy.ending(Evidence(_remote(), remote=(2, 3)))
    assert ending.code == 7
    assert ending.report.startswith(
        "poprun: instance 3 failed first: exit code 7 (host h2, pid 201)"
    )


def test_a_record_before_the_abort_beats_the_last_local_instance_to_end() -> None:
    policy = EndingPolicy(Clock(), remote=True)
    policy.launched()
    policy.instance_exited(0)  # ended (status unknown) before mpirun's abort
    policy.exit_reported(2, ExitRecord(-signal.SIGSEGV))
    policy.mpirun_aborting()
    policy.mpirun_exited(139)
    policy.streams_closed()
    ending = policy.ending(Evidence(_remote(), remote=(2, 3)))
    assert ending.code == 139
    assert "instance 2 failed first: killed by signal 11 (SIGSEGV) (host h2" in ending.report


def test_mpirun_ending_a_remote_instance_after_the_abort_is_not_the_root_cause() -> None:
    policy = EndingPolicy(Clock(), remote=True)
    policy.launched()
    policy.instance_exited(1)
    policy.mpirun_aborting()
    policy.exit_reported(3, ExitRecord(-signal.SIGTERM))  # mpirun's SIGTERM: an echo
    policy.mpirun_exited(5)
    policy.streams_closed()
    ending = policy.ending(Evidence(_remote(), remote=(2, 3)))
    assert "poprun: instance 1 failed first: exit code 5" in ending.report


def test_a_remote_failure_after_the_abort_that_mpirun_did_not_cause_is_the_root_cause() -> None:
    # A local instance had ended (exit 0, for all poprun knows) before the abort; the remote
    # one's status, exit code 7, is not something mpirun sends.
    result = RunResult(
        _remote(),
        returncode=7,
        exited_at_abort=(0,),
        exit_records=((2, ExitRecord(7)),),
        exit_records_at_abort=0,
        remote=(2, 3),
    )
    assert root_cause(result) == Failure(2, exit_code=7)


def test_mpiruns_box_still_comes_first_and_a_clean_exit_is_no_failure() -> None:
    records = ((3, ExitRecord(0)), (2, ExitRecord(4)))
    boxed = RunResult(_remote(), returncode=9, mpirun_failure=Failure(1, exit_code=9))
    assert root_cause(boxed) == Failure(1, exit_code=9)
    assert root_cause(RunResult(_remote(), returncode=4, exit_records=records)) == Failure(
        2, exit_code=4
    )
    assert decide(RunResult(_remote(), returncode=0, exit_records=((3, ExitRecord(0)),))) == (0, "")


def test_an_instance_that_raised_takes_its_own_status_from_its_record() -> None:
    instances = list(_remote())
    instances[3] = InstanceResult(3, "h2", 201, stderr_tail=("ValueError: x",), raised_at=2.0)
    result = RunResult(
        tuple(instances),
        returncode=1,
        mpirun_failure=Failure(0, signal=15),  # mpirun saw the local echo end first
        exit_records=((3, ExitRecord(2)),),
        remote=(2, 3),
    )
    assert root_cause(result) == Failure(3, exit_code=2)


def _dos(actions: list[Action]) -> list[Do]:
    return [a.do for a in actions]
