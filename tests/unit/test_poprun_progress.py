"""Progress records, the board, the hang clock in the ending policy, the verdicts (issue 27).

Pure: records are built as an instance's reporter builds them (:mod:`popdist.progress`), the
policy is driven with a fake clock.
"""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from popdist import progress
from poprun.errors import EXIT_TIMEOUT
from poprun.run.ending import GRACE_S, Do, EndingPolicy, Evidence
from poprun.run.output.instance_stream import InstanceStream
from poprun.run.progress.board import ProgressBoard, parse_line
from poprun.run.progress.diagnosis import desync_report, hang_report, wait_note
from poprun.run.progress.hang import NOTE_FRACTION, HangWatch
from poprun.run.verdict import InstanceResult
from tests.support.fakes import Clock

pytestmark = pytest.mark.unit

SECRET = "s3cr3t"


def _call(
    seq: int, shape: tuple[int, ...] = (4,), *, name: str = "g", age: float = 0.0
) -> list[Any]:
    return [seq, "allreduce", name, 16, list(shape), "float32", ["train.py", 7, "main"], age]


def _record(
    instance: int, seq: int = 0, done: int = 0, steps: int = 0, **extra: Any
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "instance": instance,
        "host": f"node{instance}",
        "pid": 100 + instance,
        "seq": seq,
        "done": done,
        "steps": steps,
        "samples": 8 * steps,
        "step_s": 0.5 * steps,
        "wait_s": 0.25,
        "bytes": 64,
        "rss": 1 << 20,
        "rss_peak": 2 << 20,
        "pending": None,
        "recent": [],
    }
    fields.update(extra)
    return fields


def _line(fields: dict[str, Any], secret: str = SECRET) -> bytes:
    return f"{progress.MARKER}{secret} {json.dumps(fields)}\n".encode()


# -- the line ---------------------------------------------------------------------------------
def test_a_line_is_read_only_with_the_jobs_secret() -> None:
    fields = _record(1, seq=3)
    assert parse_line(_line(fields), SECRET) == fields
    assert parse_line(_line(fields, secret="forged"), SECRET) is None
    assert parse_line(_line(fields), "") is None  # no secret, no records
    assert parse_line(b"plain output\n", SECRET) is None
    assert parse_line(f"{progress.MARKER}{SECRET} {{not json\n".encode(), SECRET) is None


def test_the_stream_takes_progress_lines_out_of_the_output() -> None:
    seen: list[bytes] = []

    class Sink:
        def __init__(self) -> None:
            self.data = b""

        def write(self, data: bytes) -> int:
            self.data += bytes(data)
            return len(data)

    sink = Sink()
    stream = InstanceStream(1, "stderr", sink, on_progress=lambda i, line: seen.append(line))  # type: ignore[arg-type]
    record = _line(_record(1))
    stream.feed(b"before\n" + record + b"half a line" + record + b"after\n")
    stream.close()
    assert seen == [record, record]
    assert sink.data == b"[1,1]<stderr>:before\n[1,1]<stderr>:half a line\n[1,1]<stderr>:after\n"


# -- the board --------------------------------------------------------------------------------
def test_the_board_keeps_each_instances_figures_on_poprun_clock() -> None:
    clock = Clock()
    board = ProgressBoard(clock)
    assert board.update(_record(0)) is False  # started, nothing done yet: not progress
    assert board.last_progress() is None or board.last_progress() == clock.t
    clock.advance(2)
    moved = board.update(_record(0, seq=2, done=1, steps=2, pending=_call(2, age=0.5)))
    assert moved
    (f,) = board.snapshot()
    assert (f.instance, f.host, f.pid, f.steps, f.samples, f.collectives, f.issued) == (
        0, "node0", 100, 2, 16, 1, 2,
    )  # fmt: skip
    assert f.step_time_s == 0.5 and f.rss_peak_bytes == 2 << 20 and f.last_progress == clock.t
    assert f.pending is not None and f.pending.started == clock.t - 0.5
    assert f.pending.site == "train.py:7 in main"
    clock.advance(3)
    assert board.update(_record(0, seq=2, done=1, steps=2)) is False  # the same counters
    assert board.snapshot()[0].last_progress == clock.t - 3
    board.shift(10)  # Ctrl-Z: stopped for 10 s
    assert board.snapshot()[0].last_progress == clock.t + 7


def test_a_desync_is_two_signatures_at_one_sequence_number() -> None:
    board = ProgressBoard(Clock())
    board.update(_record(0, seq=4, recent=[_call(3), _call(4, (8, 4))]))
    board.update(_record(1, seq=3, recent=[_call(3)]))
    assert board.desync() is None  # the same so far
    board.update(_record(1, seq=4, pending=_call(4, (16, 4))))
    desync = board.desync()
    assert desync is not None and desync.seq == 4
    assert (desync.first[0], desync.first[2].shape) == (0, (8, 4))
    assert (desync.second[0], desync.second[2].shape) == (1, (16, 4))
    report = desync_report(desync)
    assert "collective #4" in report and "(8, 4)" in report and "(16, 4)" in report
    assert report.count("called at train.py:7 in main") == 2


# -- the hang clock ---------------------------------------------------------------------------
def _policy(clock: Clock, timeout: float | None = 10.0, on_hang: str = "kill") -> EndingPolicy:
    policy = EndingPolicy(clock)
    policy.hang = HangWatch(timeout, on_hang)
    policy.launched()
    return policy


def _dos(actions: list[Any]) -> list[Do]:
    return [a.do for a in actions]


def test_no_hang_before_the_first_progress_nor_without_the_option() -> None:
    clock = Clock()
    policy = _policy(clock)
    policy.progressed(False)  # records while the program imports: the clock does not start
    clock.advance(100)
    assert policy.due() == [] and policy.wait_s() is None
    off = _policy(clock, timeout=None)
    off.progressed(True)
    clock.advance(1000)
    assert off.due() == [] and off.wait_s() is None


def test_the_note_then_the_verdict_then_the_kill() -> None:
    clock = Clock()
    policy = _policy(clock)
    policy.progressed(True)
    assert policy.wait_s() == pytest.approx(10 * NOTE_FRACTION)
    clock.advance(5)
    policy.progressed(True)  # progress: the clock restarts
    clock.advance(9)
    assert _dos(policy.due()) == [Do.NOTE]  # 0.6 of the time-out: once
    assert policy.due() == []
    assert policy.wait_s() == pytest.approx(1.0)
    clock.advance(1)
    assert _dos(policy.due()) == [Do.HANG]
    assert policy.wait_s() == pytest.approx(GRACE_S)
    clock.advance(GRACE_S)
    assert _dos(policy.due()) == [Do.KILL_INSTANCES]
    policy.mpirun_exited(-signal.SIGTERM)
    policy.streams_closed()
    ending = policy.ending(Evidence((InstanceResult(0, "a"),), diagnosis="poprun: the job is hung"))
    assert ending.code == EXIT_TIMEOUT and not ending.restart
    assert ending.report.startswith("poprun: the job is hung")
    assert ending.report.endswith(f"exit code {EXIT_TIMEOUT}")


def test_a_long_evaluation_within_the_time_out_is_only_noted() -> None:
    clock = Clock()
    policy = _policy(clock, timeout=30)
    policy.progressed(True)
    actions = []
    for _ in range(20):  # one instance evaluates alone for 20 s, the other waits
        clock.advance(1)
        policy.progressed(False)
        actions += policy.due()
    assert _dos(actions) == [Do.NOTE]
    policy.progressed(True)  # the evaluation ends: both move on
    clock.advance(29)
    assert _dos(policy.due()) == [Do.NOTE]  # a new quiet spell gets its own note
    policy.mpirun_exited(0)
    policy.streams_closed()
    assert policy.ending(Evidence((InstanceResult(0, "a"),))).code == 0


def test_stopped_time_does_not_count() -> None:
    clock = Clock()
    policy = _policy(clock)
    policy.progressed(True)
    clock.advance(3)
    clock.advance(100)  # Ctrl-Z: poprun and the instances stopped 100 s
    policy.stopped_for(100)
    assert policy.due() == []
    assert policy.wait_s() == pytest.approx(10 * NOTE_FRACTION - 3)


def test_on_hang_report_reports_once_per_quiet_spell_and_keeps_the_job() -> None:
    clock = Clock()
    policy = _policy(clock, on_hang="report")
    policy.progressed(True)
    clock.advance(6)
    assert _dos(policy.due()) == [Do.NOTE]
    clock.advance(4)
    assert _dos(policy.due()) == [Do.HANG_REPORT]
    clock.advance(100)
    assert policy.due() == [] and policy.wait_s() is None
    policy.progressed(True)
    clock.advance(10)
    assert _dos(policy.due()) == [Do.HANG_REPORT]  # the verdict due: no note before it
    policy.mpirun_exited(0)
    policy.streams_closed()
    assert policy.ending(Evidence((InstanceResult(0, "a"),))).code == 0


def test_a_desync_ends_the_job_at_once_with_exit_code_1() -> None:
    clock = Clock()
    policy = _policy(clock)
    assert _dos(policy.desynced()) == [Do.DESYNC]
    assert policy.desynced() == []  # once
    clock.advance(GRACE_S)
    assert _dos(policy.due()) == [Do.KILL_INSTANCES]
    policy.mpirun_exited(143)
    policy.streams_closed()
    ending = policy.ending(Evidence((InstanceResult(0, "a"),), diagnosis="poprun: out of step"))
    assert ending.code == 1 and not ending.restart
    assert ending.report == "poprun: out of step\npoprun: ended the job; exit code 1"


# -- the reports ------------------------------------------------------------------------------
def _stacks(function: str) -> list[dict[str, Any]]:
    frames = [
        ["/job/train.py", 12, function, "time.sleep(1000)"],
        ["/job/train.py", 30, "main", ""],
    ]
    return [
        {"thread": "MainThread", "frames": frames},
        {"thread": "popdist-progress", "frames": []},
    ]


def test_the_hang_report_names_the_waiting_and_the_missing_instance() -> None:
    clock = Clock()
    board = ProgressBoard(clock)
    board.update(_record(0, seq=2, done=1, pending=_call(2, name="after.stall", age=11)))
    board.update(_record(1, seq=1, done=1, stacks=_stacks("stall_here")))
    report = hang_report(
        board.snapshot(), [(0, "node0"), (1, "node1"), (2, "node2")], now=clock.t, timeout=10
    )
    assert "no instance has made progress for 10 s" in report
    assert (
        "instance 0 (host node0, pid 100) waits in collective #2 allreduce 'after.stall'" in report
    )
    assert "instance 1 (host node1, pid 101) is missing" in report
    assert 'File "/job/train.py", line 12, in stall_here' in report
    assert "popdist-progress" not in report
    assert "instance 2 (host node2) sent no progress record" in report


def test_the_note_names_the_busy_instance_and_where_it_is() -> None:
    clock = Clock()
    board = ProgressBoard(clock)
    board.update(_record(0, seq=2, pending=_call(2, age=18)))
    board.update(_record(1, seq=1, stacks=_stacks("evaluate")))
    note = wait_note(board.snapshot(), now=clock.t, timeout=30)
    assert note.startswith("poprun: note: instance 0 has waited 18 s in collective #2")
    assert "instance 1 (host node1, pid 101) at /job/train.py:12 in evaluate" in note
    assert wait_note(board.snapshot()[:1], now=clock.t, timeout=30) == ""  # nobody busy


# -- the instance's side ----------------------------------------------------------------------
class FakeBackend:
    """The collectives' methods, recorded; the bucket handle of an async allreduce."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def allreduce_async_(
        self, tensor: Any, *, average: bool = False, name: str | None = None
    ) -> Any:
        self.calls.append("async")
        return "handle"

    def wait(self, handle: Any) -> None:
        self.calls.append("wait")

    def allreduce_(self, tensor: Any, *, average: bool = False, name: str | None = None) -> Any:
        handle = self.allreduce_async_(tensor, name=name)  # nested: part of this call
        self.wait(handle)
        return tensor

    def barrier(self) -> None:
        raise RuntimeError("MPI_ERR_TRUNCATE")


class FakeTensor:
    shape = (2, 3)
    dtype = "torch.float32"

    def numel(self) -> int:
        return 6

    def element_size(self) -> int:
        return 4


def test_the_tracker_counts_issued_and_finished_collectives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker = progress.Tracker()
    monkeypatch.setattr(progress, "tracker", tracker)
    monkeypatch.setattr(progress, "_reporter", None)
    backend = progress.instrument(FakeBackend())
    assert progress.instrument(backend) is backend  # once
    handles = [backend.allreduce_async_(FakeTensor(), name=f"g{i}") for i in range(2)]
    assert (tracker.seq, tracker.done, tracker.bytes_reduced) == (2, 0, 48)
    backend.wait(handles[0])  # one handle for both (a bucket)
    assert (tracker.seq, tracker.done) == (2, 2)
    backend.allreduce_(FakeTensor(), name="explicit")
    assert (tracker.seq, tracker.done) == (3, 3)  # the nested async and wait are part of it
    seq, kind, name, nbytes, shape, dtype, site, _ = tracker.recent[-1]
    assert dtype == "torch.float32"
    assert (seq, kind, name, nbytes, shape) == (3, "allreduce", "explicit", 24, (2, 3))
    assert site[2] == "test_the_tracker_counts_issued_and_finished_collectives"
    registered: list[Any] = []
    monkeypatch.setattr("atexit.register", registered.append)
    with pytest.raises(RuntimeError):
        backend.barrier()
    assert tracker.failed is not None and tracker.failed[1] == "barrier"
    assert tracker.failure == "RuntimeError: MPI_ERR_TRUNCATE"
    assert registered == [progress._end_after_failure]  # the instance ends at exit
    progress.leave(None)  # an executor call that raised: no step
    progress.leave(None, 16, 0.25)  # one that returned: a step
    assert (tracker.steps, tracker.samples, tracker.step_s) == (1, 16, 0.25)


def test_nothing_is_counted_unless_poprun_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "tracker", None)
    backend = FakeBackend()
    assert progress.instrument(backend) is backend and "allreduce_" not in vars(backend)
    progress.leave(None, 8, 0.5)  # no tracker: nothing
    assert progress.start_if_asked({}) is False


def test_no_hang_once_every_instance_has_ended_its_program() -> None:
    clock = Clock()
    board = ProgressBoard(clock)
    board.update(_record(0, seq=5, done=5, steps=2))
    board.update(_record(1, seq=5, done=5, steps=2))
    assert board.update(_record(0, seq=5, done=5, steps=2, exiting=True))  # ending: progress
    assert not board.finishing()  # instance 1 still runs
    board.update(_record(1, seq=5, done=5, steps=2, exiting=True))
    assert board.finishing()
    policy = _policy(clock)
    policy.progressed(True, finishing=True)
    clock.advance(100)  # a slow exit is no hang
    assert policy.due() == [] and policy.wait_s() is None
