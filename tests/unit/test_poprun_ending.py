"""The ending policy (pure): every way a run ends, driven event by event with a fake clock."""

from __future__ import annotations

import signal

import pytest

from poprun.run.ending import (
    DRAIN_S,
    GRACE_S,
    MPIRUN_GRACE_S,
    REMOTE_GRACE_S,
    STEP_S,
    Do,
    EndingPolicy,
    Evidence,
)
from poprun.run.evidence import ErrorRecord, Failure
from poprun.run.verdict import InstanceResult
from tests.support.fakes import Clock
from tests.support.fakes import instances as _instances

pytestmark = pytest.mark.unit


def _policy(clock: Clock, **kwargs: object) -> EndingPolicy:
    policy = EndingPolicy(clock, **kwargs)  # type: ignore[arg-type]
    policy.launched()
    return policy


def _dos(actions: list[object]) -> list[Do]:
    return [a.do for a in actions]  # type: ignore[attr-defined]


def test_success_stops_reading_when_mpirun_exits_and_the_streams_end() -> None:
    clock = Clock()
    policy = _policy(clock)
    assert policy.wait_s() is None  # nothing to wait for but events
    assert _dos(policy.mpirun_exited(0)) == [Do.DRAIN]
    assert policy.reading
    assert _dos(policy.streams_closed()) == [Do.STOP_READING]
    assert not policy.reading
    ending = policy.ending(Evidence(_instances()))
    assert (ending.code, ending.report, ending.restart) == (0, "", "")


def test_streams_that_close_before_mpirun_exits_keep_the_loop_waiting() -> None:
    policy = _policy(Clock())
    assert policy.streams_closed() == []
    assert policy.reading
    assert _dos(policy.mpirun_exited(0)) == [Do.DRAIN, Do.STOP_READING]


def test_a_stream_held_open_is_given_up_at_the_drain_deadline() -> None:
    clock = Clock()
    policy = _policy(clock)
    policy.mpirun_exited(0)
    assert policy.wait_s() == pytest.approx(DRAIN_S)
    clock.advance(DRAIN_S - 0.01)
    assert policy.due() == []
    clock.advance(0.01)
    assert _dos(policy.due()) == [Do.STOP_READING]
    assert not policy.reading


def test_first_local_failure_gets_the_grace_period_then_the_instances_then_mpirun() -> None:
    clock = Clock()
    policy = _policy(clock)
    policy.instance_exited(1)
    policy.mpirun_aborting()
    assert policy.wait_s() == pytest.approx(GRACE_S)
    clock.advance(GRACE_S)
    assert _dos(policy.due()) == [Do.KILL_INSTANCES]
    assert policy.wait_s() == pytest.approx(MPIRUN_GRACE_S)
    clock.advance(MPIRUN_GRACE_S)
    assert _dos(policy.due()) == [Do.KILL_MPIRUN]
    assert policy.due() == []
    policy.mpirun_exited(-9)
    policy.streams_closed()
    ending = policy.ending(Evidence(_instances(3), mpirun_failure=Failure(1, exit_code=3)))
    assert ending.code == 3
    assert ending.report.startswith("poprun: instance 1 failed first: exit code 3")
    assert ending.report.endswith(
        "poprun: the job did not end by itself in time: poprun sent SIGKILL"
    )


def test_first_failure_that_ends_in_time_is_not_escalated() -> None:
    clock = Clock()
    policy = _policy(clock)
    policy.instance_exited(0)
    policy.mpirun_aborting()
    clock.advance(0.3)
    assert _dos(policy.mpirun_exited(5)) == [Do.DRAIN]
    clock.advance(GRACE_S)
    assert Do.KILL_INSTANCES not in _dos(policy.due())
    ending = policy.ending(Evidence(_instances()))
    assert ending.code == 5  # mpirun named no one: the last instance to end before the abort
    assert "instance 0 failed first: exit code 5" in ending.report
    assert "did not end by itself" not in ending.report


def test_a_remote_failure_gets_the_longer_grace() -> None:
    clock = Clock()
    policy = _policy(clock, remote=True)
    policy.mpirun_aborting()
    assert policy.wait_s() == pytest.approx(REMOTE_GRACE_S)
    clock.advance(GRACE_S)
    assert policy.due() == []


def test_a_remote_failure_decided_from_the_box_when_mpirun_exits_before_the_stream_ends() -> None:
    # The racy order across hosts: mpirun's box and exit arrive, the remote instance's stderr
    # (and its end) after. The verdict waits for the streams' end; with the box alone it
    # still names the instance and its code.
    clock = Clock()
    instances = (
        InstanceResult(0, "h1", 100),
        InstanceResult(1, "h2", None, stderr_tail=("instance 1 is failing on purpose",)),
    )
    policy = _policy(clock, remote=True)
    policy.mpirun_aborting()
    assert _dos(policy.mpirun_exited(7)) == [Do.DRAIN]
    assert policy.reading  # not decided yet: the stream may still bring the evidence
    clock.advance(0.2)
    assert _dos(policy.streams_closed()) == [Do.STOP_READING]
    ending = policy.ending(Evidence(instances, mpirun_failure=Failure(1, exit_code=7), remote=(1,)))
    assert ending.code == 7
    assert ending.report.startswith("poprun: instance 1 failed first: exit code 7 (host h2")
    assert "instance 1 is failing on purpose" in ending.report


def test_a_remote_record_that_arrives_after_the_box_names_the_root_cause() -> None:
    record = ErrorRecord(
        "ValueError", "bad shard", "Traceback...\nValueError: bad shard\n", 7, "h2", 1
    )
    instances = (
        InstanceResult(0, "h1", 100),
        InstanceResult(1, "h2", 7, error=record, raised_at=5.0),
    )
    policy = _policy(Clock(), remote=True)
    policy.mpirun_exited(1)
    policy.streams_closed()
    ending = policy.ending(Evidence(instances, mpirun_failure=Failure(1, exit_code=1), remote=(1,)))
    assert ending.report.splitlines()[:2] == [
        "poprun: instance 1 failed first: exit code 1 (host h2, pid 7)",
        "poprun: instance 1 raised ValueError: bad shard",
    ]


def test_launch_failure() -> None:
    policy = EndingPolicy(Clock())
    policy.launch_failed("No such file or directory: 'mpirun'")
    assert not policy.reading
    ending = policy.ending(Evidence(_instances()))
    assert ending.code == 1
    assert ending.report == "poprun: cannot start mpirun: No such file or directory: 'mpirun'"


def test_a_signal_before_the_launch_launches_nothing() -> None:
    policy = EndingPolicy(Clock())
    assert policy.signal_received(signal.SIGINT) == []
    assert not policy.may_launch()
    ending = policy.ending(Evidence(_instances()))
    assert ending.code == 130 and ending.restart == ""
    assert "received SIGINT before the job started; nothing was launched" in ending.report


def test_a_signal_is_forwarded_then_escalated_and_sets_the_exit_code() -> None:
    clock = Clock()
    policy = _policy(clock)
    actions = policy.signal_received(signal.SIGTERM)
    assert _dos(actions) == [Do.FORWARD] and actions[0].signum == signal.SIGTERM
    clock.advance(GRACE_S)
    assert _dos(policy.due()) == [Do.KILL_INSTANCES]
    policy.mpirun_exited(-15)
    policy.streams_closed()
    ending = policy.ending(Evidence(_instances()))
    assert ending.code == 143
    assert ending.report == "poprun: received SIGTERM; ended the job; exit code 143"


def test_a_second_signal_kills_the_instances_and_their_groups_at_once() -> None:
    clock = Clock()
    policy = _policy(clock)
    policy.signal_received(signal.SIGINT)
    clock.advance(0.02)
    actions = policy.signal_received(signal.SIGINT)
    assert _dos(actions) == [Do.KILL_INSTANCES] and actions[0].groups
    assert policy.wait_s() == pytest.approx(MPIRUN_GRACE_S)
    clock.advance(MPIRUN_GRACE_S)
    assert _dos(policy.due()) == [Do.KILL_MPIRUN]
    policy.mpirun_exited(-9)
    policy.streams_closed()
    ending = policy.ending(Evidence(_instances()))
    assert ending.code == 130  # the first signal's: never death by the second
    assert "received SIGINT, then SIGINT: killed the job at once; exit code 130" in ending.report


def test_a_signal_after_mpirun_exited_only_sets_the_exit_code() -> None:
    policy = _policy(Clock())
    policy.mpirun_exited(0)
    assert policy.signal_received(signal.SIGHUP) == []
    assert policy.ending(Evidence(_instances())).code == 129


def test_time_out_ends_the_job_then_escalates() -> None:
    clock = Clock()
    policy = _policy(clock, timeout=30.0)
    assert policy.wait_s() == pytest.approx(30.0)
    clock.advance(29.9)
    assert policy.due() == []
    clock.advance(0.1)
    assert _dos(policy.due()) == [Do.TIME_OUT]
    clock.advance(GRACE_S)
    assert _dos(policy.due()) == [Do.KILL_INSTANCES]
    policy.mpirun_exited(-15)
    policy.streams_closed()
    ending = policy.ending(Evidence(_instances(), still_running=(0, 1)))
    assert ending.code == 124
    assert ending.report.startswith("poprun: --timeout=30 s expired; instances still running: 0 ")
    assert ending.restart == ""


def test_a_time_out_of_years_is_waited_for_in_steps() -> None:
    clock = Clock()
    year = 365 * 24 * 3600.0
    policy = _policy(clock, timeout=year)
    assert policy.wait_s() == STEP_S  # never past what epoll can wait (24.8 days)
    clock.advance(year - 1)
    assert policy.wait_s() == pytest.approx(1.0)
    clock.advance(1)
    assert _dos(policy.due()) == [Do.TIME_OUT]


def test_time_stopped_by_ctrl_z_does_not_count() -> None:
    clock = Clock()
    policy = _policy(clock, timeout=10.0)
    clock.advance(9.0)
    policy.stopped_for(100.0)
    clock.advance(100.0)
    assert policy.due() == []
    clock.advance(1.0)
    assert _dos(policy.due()) == [Do.TIME_OUT]


def test_a_failure_is_restarted_until_the_budget_is_spent() -> None:
    policy = _policy(Clock(), max_restarts=2)
    for attempt in (1, 2):
        policy.mpirun_exited(3)
        ending = policy.ending(Evidence(_instances(), mpirun_failure=Failure(0, exit_code=3)))
        assert ending.code == 3
        assert ending.restart == (
            f"poprun: the job failed with exit code 3: restarting the job (restart {attempt} of 2)"
        )
        assert policy.reading  # a fresh attempt
        policy.launched()
    policy.mpirun_exited(3)
    ending = policy.ending(Evidence(_instances(), mpirun_failure=Failure(0, exit_code=3)))
    assert ending.code == 3 and ending.restart == ""  # budget exhausted
    assert policy.restarts == 2


@pytest.mark.parametrize("how", ["signal", "timeout", "success"])
def test_no_restart_after_a_signal_a_time_out_or_success(how: str) -> None:
    clock = Clock()
    policy = _policy(clock, timeout=5.0, max_restarts=3)
    if how == "signal":
        policy.signal_received(signal.SIGINT)
    elif how == "timeout":
        clock.advance(5.0)
        policy.due()
    policy.mpirun_exited(0 if how == "success" else 1)
    assert policy.ending(Evidence(_instances())).restart == ""


def test_unknown_status_when_mpirun_was_killed_before_it_said() -> None:
    clock = Clock()
    policy = _policy(clock)
    policy.instance_exited(1)
    policy.mpirun_aborting()
    clock.advance(GRACE_S + MPIRUN_GRACE_S)
    policy.due()
    policy.due()
    policy.mpirun_exited(-9)
    ending = policy.ending(Evidence(_instances()))
    assert "instance 1 failed first: ended first (mpirun was stopped before it reported" in (
        ending.report
    )
    assert ending.code == 1  # the status is not known: a failure all the same
