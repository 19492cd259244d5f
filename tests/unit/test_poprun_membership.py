"""Membership (poprun.run.membership.members), driven by a fake clock: who is in the job,
when a host is probed, when it is lost, what comes after, and re-admission."""

from __future__ import annotations

import pytest

from poprun.config.run_config import build
from poprun.errors import EXIT_HOSTS_LOST
from poprun.plan.environment import instance_values
from poprun.plan.topology import on_hosts, plan
from poprun.run.ending import (
    DRAIN_S,
    GRACE_S,
    LOST_DRAIN_S,
    LOST_GRACE_S,
    Do,
    EndingPolicy,
    Evidence,
)
from poprun.run.evidence import ExitRecord, Failure
from poprun.run.membership.members import (
    MAX_LOSSES,
    PROBE_EVERY_S,
    READMIT_EVERY_S,
    SILENT_S,
    Membership,
)
from tests.support.fakes import Clock, instances

pytestmark = pytest.mark.unit

HOSTS = ("h1", "h2", "h3")


def _members(clock: Clock, **kw: object) -> Membership:
    m = Membership(HOSTS, clock, launch_host="h1", **kw)  # type: ignore[arg-type]
    m.launched()
    return m


def _watched_policy(
    clock: Clock, min_hosts: int, max_restarts: int = 0
) -> tuple[EndingPolicy, Membership]:
    """An ending policy across hosts with its membership, the job launched."""
    policy = EndingPolicy(clock, remote=True, max_restarts=max_restarts)
    policy.membership = m = _members(clock, min_hosts=min_hosts)
    policy.launched()
    return policy, m


def test_a_host_heard_from_is_never_probed() -> None:
    clock = Clock()
    m = _members(clock)
    for _ in range(20):
        clock.advance(1.0)
        m.heard("h2")
        m.heard("h3")
        assert m.to_probe() == []


def test_a_silent_host_is_probed_after_silent_s_and_again_while_it_answers() -> None:
    clock = Clock()
    m = _members(clock)
    clock.advance(SILENT_S - 0.1)
    m.heard("h2")
    assert m.to_probe() == []
    clock.advance(0.1)
    assert m.to_probe() == ["h3"]  # h2 was heard 0.1 s ago; h1 (the launch host) never
    assert m.to_probe() == []  # being asked
    m.answered("h3", True)
    assert m.losses == ()  # silent but answering: busy, not lost
    clock.advance(PROBE_EVERY_S - 0.1)
    m.heard("h2")
    assert m.to_probe() == []
    clock.advance(0.1)
    assert m.to_probe() == ["h3"]


def test_a_silent_host_that_does_not_answer_is_lost_once() -> None:
    clock = Clock()
    m = _members(clock, min_hosts=2)
    clock.advance(SILENT_S)
    m.heard("h2")
    assert m.to_probe() == ["h3"]
    m.answered("h3", False, "Connection timed out")
    [loss] = m.take_losses()
    assert (loss.host, loss.why) == ("h3", "no answer: Connection timed out")
    assert m.take_losses() == []
    m.lose("h3", "again")  # already out this attempt
    assert len(m.losses) == 1 and m.times_lost("h3") == 1


def test_the_launch_host_is_never_lost() -> None:
    m = _members(Clock())
    m.lose("h1", "whatever")
    assert m.losses == () and m.watched() == ("h2", "h3")


def test_relaunch_on_the_rest_with_a_new_generation() -> None:
    clock = Clock()
    m = _members(clock, min_hosts=2)
    m.lose("h3", "no answer")
    following = m.relaunch()
    assert following.hosts == ("h1", "h2") and following.generation == 1
    assert "lost host h3 (no answer)" in following.line
    assert m.members == ("h1", "h2") and m.watched() == ("h2",)
    m.launched()
    clock.advance(SILENT_S)
    assert m.to_probe() == ["h2"]  # h3 is out: not watched (no --readmit)


def test_below_min_hosts_the_job_ends() -> None:
    m = _members(Clock(), min_hosts=3)
    m.lose("h2", "it does not answer")
    following = m.relaunch()
    assert following.hosts == () and "fewer than the job needs (--min-hosts=3)" in following.line
    m2 = _members(Clock())  # no --min-hosts: every host is needed
    m2.lose("h3", "x")
    assert m2.relaunch().hosts == () and "no --min-hosts" in m2.relaunch().line


def test_next_time_is_the_next_silence_deadline() -> None:
    clock = Clock()
    m = _members(clock)
    assert m.next_time() == clock() + SILENT_S
    m.to_probe()  # nothing due yet
    clock.advance(SILENT_S)
    assert sorted(m.to_probe()) == ["h2", "h3"]
    assert m.next_time() is None  # both being asked
    m.answered("h2", True)
    assert m.next_time() == clock() + PROBE_EVERY_S


def test_readmission_after_a_lost_host_answers_again_until_k_losses() -> None:
    clock = Clock()
    m = _members(clock, min_hosts=2, readmit=True)
    for round_ in range(1, MAX_LOSSES + 1):
        m.lose("h3", "it does not answer")
        m.relaunch()
        m.launched()
        clock.advance(READMIT_EVERY_S)
        due = m.to_probe()
        if round_ == MAX_LOSSES:  # lost K times: left out for the rest of the job
            assert "h3" not in due and m.returning() == ()
            break
        assert "h3" in due
        m.answered("h3", True)
        assert m.returning() == ("h3",)
        back = m.relaunch(readmitting=True)
        assert back.hosts == HOSTS and "readmitting h3" in back.line
        assert m.members == HOSTS


def test_the_policy_ends_the_job_on_a_loss_and_relaunches_on_the_rest() -> None:
    clock = Clock()
    policy, m = _watched_policy(clock, min_hosts=2)
    clock.advance(SILENT_S)
    m.to_probe()
    m.answered("h3", False, "Connection refused")
    [action] = [a for a in policy.due() if a.do is Do.HOST_LOST]
    assert "lost host h3: no answer: Connection refused" in action.why
    assert policy.due() == []  # named once
    policy.mpirun_exited(143)
    ending = policy.ending(Evidence(instances=instances(3)))
    assert ending.hosts == ("h1", "h2") and "generation 1" in ending.restart
    assert policy.restarts == 0  # a membership change is not a restart


def test_after_a_loss_mpirun_and_the_instances_are_killed_at_once_not_after_a_grace() -> None:
    """The survivors wait in a collective for the lost host, where no handler runs: a grace
    would only delay the relaunch (at the time-out, by contrast, they get one)."""
    clock = Clock()
    policy, m = _watched_policy(clock, min_hosts=2)
    m.lose("h3", "it does not answer")
    assert [a.do for a in policy.due()] == [Do.HOST_LOST]
    clock.advance(LOST_GRACE_S)
    assert [a.do for a in policy.due()] == [Do.KILL_MPIRUN]  # not first the instances only
    assert LOST_GRACE_S < GRACE_S


def test_the_policy_ends_with_exit_hosts_lost_below_min_hosts() -> None:
    clock = Clock()
    policy, m = _watched_policy(clock, min_hosts=3, max_restarts=5)
    m.lose("h2", "it does not answer")
    policy.due()
    policy.mpirun_exited(143)
    ending = policy.ending(Evidence(instances=instances(3)))
    assert ending.code == EXIT_HOSTS_LOST == 69 and not ending.restart


def test_the_smaller_job_keeps_the_replicas_and_the_instances_per_host() -> None:
    config = build({"host": ["a,b,c"], "num_instances": "6", "num_replicas": "6"}, ("x",), {})
    smaller = on_hosts(config, ("a", "c"))
    assert (smaller.hosts, smaller.host_counts, smaller.num_instances) == (("a", "c"), (2, 2), 4)
    planned = plan(smaller)
    assert [(p.host, p.num_local_replicas, p.replica_offset) for p in planned.instances] == [
        ("a", 2, 0), ("a", 2, 2), ("c", 1, 4), ("c", 1, 5),
    ]  # fmt: skip
    values = [instance_values(smaller, instance) for instance in planned.instances]
    assert [v["POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"] for v in values] == ["0"] * 4
    assert [v["POPDIST_NUM_LOCAL_REPLICAS"] for v in values] == ["2", "2", "1", "1"]
    assert [v["POPDIST_REPLICA_INDEX_OFFSET"] for v in values] == ["0", "2", "4", "5"]


def _placed(clock: Clock, **kw: object) -> Membership:
    """Two instances on each host (0, 1 on h1; 2, 3 on h2; 4, 5 on h3)."""
    m = Membership(HOSTS, clock, launch_host="h1", **kw)  # type: ignore[arg-type]
    m.launched({i: HOSTS[i // 2] for i in range(6)})
    return m


def test_a_host_whose_instances_all_report_a_kill_is_lost_after_the_attempt() -> None:
    """The records make every host be asked at once; whose failure it was is judged from all
    of them once the attempt has ended, not as they arrive."""
    clock = Clock()
    m = _placed(clock, min_hosts=2)
    m.exited(4, -9)
    assert m.to_probe() == ["h2", "h3"]  # a failure: every host is asked at once
    m.exited(5, -15)
    m.answered("h3", True)
    m.answered("h2", True)
    assert m.losses == ()  # nothing is judged while the attempt runs
    records = [
        (4, ExitRecord(-9)),
        (2, ExitRecord(-15)),
        (3, ExitRecord(-15)),
        (5, ExitRecord(-15)),
    ]
    assert m.blame(records) == ""
    [loss] = m.take_losses()
    assert (loss.host, loss.why) == (
        "h3", "instance 4 killed by SIGKILL first; h2's 2 instances were ended by mpirun"
    )  # fmt: skip


def test_a_kill_is_no_loss_when_another_host_does_not_answer() -> None:
    """A crashed h3 takes h2's instances down with it (mpirun's daemon ends them, SIGTERM):
    h3 does not answer, so h3 is lost, not h2."""
    m = _placed(Clock(), min_hosts=2)
    m.exited(2, -15)
    m.exited(3, -15)
    m.to_probe()
    m.answered("h2", True)
    m.answered("h3", False, "Connection refused")
    assert [loss.host for loss in m.losses] == ["h3"]
    assert m.blame([(2, ExitRecord(-15)), (3, ExitRecord(-15))]) == ""  # judged already
    assert [loss.host for loss in m.losses] == ["h3"]


def test_a_kill_is_no_loss_without_min_hosts_or_where_an_instance_exited_by_itself() -> None:
    plain = _placed(Clock())  # no --min-hosts: a killed instance is a failure, as before
    plain.exited(4, -9)
    assert plain.to_probe() == [] and plain.blame([(4, ExitRecord(-9)), (5, ExitRecord(-9))]) == ""
    assert plain.losses == ()
    clean = _placed(Clock(), min_hosts=2)
    # ended well, then its neighbour killed: not every instance there was killed
    assert clean.blame([(4, ExitRecord(0)), (5, ExitRecord(-9))]) == ""
    assert clean.losses == ()
    raised = _placed(Clock(), min_hosts=2)  # mpirun names h3's exit code 1: its own failure
    records = [(2, ExitRecord(-15)), (3, ExitRecord(-15)), (4, ExitRecord(1)), (5, ExitRecord(-15))]
    assert raised.blame(records, mpirun_failure=Failure(4, exit_code=1)) == ""
    assert raised.losses == ()


def test_a_failing_attempt_asks_every_host_at_once_and_only_once() -> None:
    clock = Clock()
    m = _placed(clock, min_hosts=2)
    clock.advance(0.5)
    m.heard("h2")
    m.heard("h3")
    assert m.to_probe() == [] and m.unasked() == ("h2", "h3")
    m.failing()
    assert m.next_time() == clock()
    assert m.to_probe() == ["h2", "h3"]  # not silent, asked anyway
    clock.advance(0.4)
    m.answered("h2", True)
    m.answered("h3", False, "Connection refused")
    assert [loss.host for loss in m.losses] == ["h3"]
    assert m.unasked() == ()  # h2 answered since, h3 is out: nothing to ask after
    m.failing()  # once per attempt
    assert m.to_probe() == []


def test_a_killed_remote_host_is_named_when_the_attempt_ends() -> None:
    """The exit record of h3's instance (-9) arrives while the job runs: every host is
    asked at once; once mpirun has ended the job, h3 is named from the attempt's evidence.
    After poprun began ending the job (a signal), a kill is its own: no host is lost."""
    clock = Clock()
    policy = EndingPolicy(clock, remote=True, max_restarts=0)
    policy.membership = m = Membership(HOSTS, clock, launch_host="h1", min_hosts=2)
    m.launched({0: "h1", 1: "h2", 2: "h3"})
    policy.launched()
    policy.exit_reported(1, ExitRecord(-15))  # mpirun's teardown of h2's instance, first
    policy.mpirun_aborting()
    assert m.to_probe() == ["h2", "h3"]
    m.answered("h2", True)
    m.answered("h3", True)
    policy.exit_reported(2, ExitRecord(-9))  # the killed instance's record, after the abort
    assert [a.do for a in policy.due()] == []  # nothing named while mpirun ends the job
    policy.mpirun_exited(137)
    policy.streams_closed()
    ending = policy.ending(Evidence(instances(3)))
    assert ending.hosts == ("h1", "h2")
    assert ending.restart.startswith(
        "poprun: lost host h3 (instance 2 killed by SIGKILL first; h2's instance was ended "
        "by mpirun): launching the job again on h1, h2 (generation 1)"
    )
    other = EndingPolicy(clock, remote=True, max_restarts=0)
    other.membership = m2 = Membership(HOSTS, clock, launch_host="h1", min_hosts=2)
    m2.launched({0: "h1", 1: "h2", 2: "h3"})
    other.launched()
    other.signal_received(2)
    other.exit_reported(2, ExitRecord(-9))
    other.mpirun_exited(130)
    other.streams_closed()
    assert not other.ending(Evidence(instances(3))).hosts and m2.losses == ()


def test_after_a_loss_the_output_is_not_waited_for_long() -> None:
    """A surviving host's ssh session holds mpirun's output until its daemon ends: after a
    loss the job's output gets LOST_DRAIN_S, not DRAIN_S (the survivors were killed)."""
    clock = Clock()
    policy, m = _watched_policy(clock, min_hosts=2)
    m.lose("h3", "it does not answer")
    policy.due()
    policy.mpirun_exited(-9)
    clock.advance(LOST_DRAIN_S)
    assert [a.do for a in policy.due()] == [Do.STOP_READING]
    assert LOST_DRAIN_S < DRAIN_S


def test_a_host_heard_from_after_the_failure_counts_as_answering() -> None:
    """The survivors' lease heartbeats (once a second) come before an ssh probe's answer on
    a loaded machine: heard from since the failure, a host need not be asked again."""
    clock = Clock()
    m = _placed(clock, min_hosts=2)
    m.exited(4, -9)
    clock.advance(0.2)
    m.heard("h2", at=clock() - 0.3)  # before the failure: no evidence
    assert m.unasked() == ("h2", "h3")
    m.heard("h2")
    assert m.unasked() == ("h3",)


def test_without_a_probe_command_the_watch_never_asks_the_loop_to_turn() -> None:
    """No prober (an agent poprun cannot run itself): a silent host is never probed, so the
    watch gives the loop no time to wake at (a time already past would make it spin)."""
    from poprun.run.membership.watch import HostWatch

    clock = Clock()
    m = _members(clock, min_hosts=2)
    watch = HostWatch(m, None, clock=clock)
    try:
        clock.advance(SILENT_S * 3)
        watch.tick()
        assert m.next_time() is not None and m.next_time() <= clock()  # type: ignore[operator]
        assert watch.wait_s() is None
    finally:
        watch.close()
