"""Whose failure came first (poprun.run.membership.blame), and the host the membership then
loses, from what happened, not from the order the records arrived in (issue 51).

The case: three hosts, one instance each (0 on the launch host h1, 1 on h2, 2 on h3), with
``--min-hosts 2``. One instance's program is killed; mpirun's teardown then ends the
others with SIGTERM. The records reach poprun in any order (the killed one first, last, or
never), with or without mpirun's box, Open MPI's peer report and the wrappers' end times.
"""

from __future__ import annotations

import itertools
import signal

import pytest

from poprun.run.ending import EndingPolicy, Evidence
from poprun.run.evidence import ExitRecord, Failure, MpirunMessages
from poprun.run.membership.blame import (
    CLOCK_SLACK_S,
    MPIRUN,
    PEER,
    SIGNALS,
    TIMES,
    End,
    first_failure,
)
from poprun.run.membership.members import Membership
from tests.support.fakes import Clock, instances

pytestmark = pytest.mark.unit

HOSTS = ("h1", "h2", "h3")
PLACEMENT = {0: "h1", 1: "h2", 2: "h3"}
T0 = 1_790_000_000.0  # the wall clock when the program was killed
TEARDOWN_S = 0.08  # ... and how long mpirun's SIGTERM took to end the others


def _records(killed: int, signum: int, *, order: str, times: bool) -> list[tuple[int, ExitRecord]]:
    """The remote instances' exit records as they arrive: ``order`` "first", "last" or
    "missing" for the killed instance's own record."""
    torn = [i for i in PLACEMENT if i not in (0, killed)]  # the launch host's: by pid only
    own = (killed, ExitRecord(-signum, T0 if times else None))
    echoes = [(i, ExitRecord(-signal.SIGTERM, T0 + TEARDOWN_S if times else None)) for i in torn]
    return {"first": [own, *echoes], "last": [*echoes, own], "missing": echoes}[order]


def _policy(clock: Clock) -> tuple[EndingPolicy, Membership]:
    policy = EndingPolicy(clock, remote=True)
    policy.membership = m = Membership(HOSTS, clock, launch_host="h1", min_hosts=2)
    m.launched(PLACEMENT)
    policy.launched()
    return policy, m


def _run(
    records: list[tuple[int, ExitRecord]], *, box: Failure | None, peers: tuple[str, ...]
) -> tuple[str, str, tuple[str, ...]]:
    """The attempt through the ending policy, the abort arriving among the records: the
    restart line, the report, and the hosts of the next attempt."""
    clock = Clock()
    policy, m = _policy(clock)
    for n, (instance, record) in enumerate(records):
        if n == 1:
            policy.mpirun_aborting()
            for host in m.to_probe():
                m.answered(host, True)  # every host answers: none crashed
        clock.advance(0.05)
        policy.exit_reported(instance, record)
    policy.mpirun_exited(137)
    policy.streams_closed()
    ending = policy.ending(Evidence(instances(3), mpirun_failure=box, peers=peers))
    return ending.restart, ending.report, ending.hosts


CASES = list(
    itertools.product(
        [(2, "h3"), (1, "h2")],  # the last host's instance, the middle host's
        [signal.SIGKILL, signal.SIGSEGV],
        ["first", "last", "missing"],
        [True, False],  # mpirun's box
        [True, False],  # Open MPI's peer report
        [True, False],  # the wrappers' end times
    )
)


@pytest.mark.parametrize(("victim", "signum", "order", "box", "peer", "times"), CASES)
def test_the_right_host_or_none_in_every_arrival_order(
    victim: tuple[int, str],
    signum: int,
    order: str,
    box: bool,
    peer: bool,
    times: bool,
) -> None:
    killed, host = victim
    records = _records(killed, signum, order=order, times=times)
    failure = Failure(killed, signal=signum) if box else None
    restart, report, hosts = _run(records, box=failure, peers=(host,) if peer else ())
    if order != "missing" or box:
        other = "h2" if host == "h3" else "h3"
        name = signal.Signals(signum).name
        assert restart.startswith(
            f"poprun: lost host {host} (instance {killed} killed by {name} first; "
            f"{other}'s instance was ended by mpirun): launching the job again on "
        ), restart
        assert hosts == tuple(h for h in HOSTS if h != host)
    else:  # only the teardown's SIGTERMs (and perhaps a peer report): nobody is lost
        assert not restart and not hosts
        assert "poprun: no host is lost: " in report
        assert "the job failed as an instance did" in report


def test_records_that_cannot_tell_name_nobody_and_say_why() -> None:
    torn = [End(1, "h2", -15, T0), End(2, "h3", -15, T0 + 0.01)]
    first = first_failure(torn, PLACEMENT)
    assert first.host is None
    assert first.why_not == "the instances' ends (ended by SIGTERM) do not tell which came first"


def test_the_evidence_that_disagrees_names_nobody() -> None:
    ends = [End(1, "h2", -15), End(2, "h3", -9)]
    first = first_failure(ends, PLACEMENT, mpirun_first=1)  # mpirun says h2's came first
    assert first.host is None
    assert first.why_not == (
        "the evidence disagrees on which host failed first (mpirun's report: h2; the signals: h3)"
    )
    clock = Clock()
    _, m = _policy(clock)
    line = m.blame(
        [(1, ExitRecord(-15)), (2, ExitRecord(-9))], mpirun_failure=Failure(1, signal=15)
    )
    assert line.startswith("poprun: no host is lost: the evidence disagrees") and m.losses == ()


def test_each_kind_of_evidence_is_named_and_alone_decides() -> None:
    killed = End(2, "h3", -9, T0)
    torn = End(1, "h2", -15, T0 + TEARDOWN_S)
    assert first_failure([torn, killed], PLACEMENT).by == (SIGNALS, TIMES)
    assert first_failure([torn], PLACEMENT, mpirun_first=2).by == (MPIRUN,)
    assert first_failure([torn], PLACEMENT, peers=("h3.job.default.svc",)).by == (PEER,)
    # a teardown's SIGKILL (a program that ignored SIGTERM), a second later: the clocks
    late = End(1, "h2", -9, T0 + 1.0)
    assert first_failure([late, killed], PLACEMENT) == (
        first_failure([killed, late], PLACEMENT)
    )  # fmt: skip
    assert first_failure([late, killed], PLACEMENT).host == "h3"
    assert first_failure([late, killed], PLACEMENT).by == (TIMES,)


def test_end_times_within_the_clocks_slack_tell_nothing() -> None:
    a, b = End(1, "h2", -9, T0), End(2, "h3", -9, T0 + CLOCK_SLACK_S / 2)
    assert first_failure([a, b], PLACEMENT).host is None
    # a SIGTERM that merely came first by the clocks names nobody by itself
    c, d = End(1, "h2", -15, T0), End(2, "h3", -15, T0 + 1.0)
    assert first_failure([c, d], PLACEMENT).host is None


def test_the_why_names_the_evidence_when_the_signal_did_not_decide() -> None:
    clock = Clock()
    _, m = _policy(clock)
    assert m.blame([(1, ExitRecord(-15))], mpirun_failure=Failure(2, signal=15)) == ""
    [loss] = m.losses
    assert loss.why == (
        "instance 2 ended by SIGTERM first (mpirun's report); h2's instance was ended by mpirun"
    )


def test_a_first_failure_on_the_launch_host_or_by_an_exit_code_is_no_lost_host() -> None:
    clock = Clock()
    _, m = _policy(clock)
    torn = [(1, ExitRecord(-15)), (2, ExitRecord(-15))]
    assert m.blame(torn, mpirun_failure=Failure(0, signal=9)) == "" and m.losses == ()
    assert m.blame(torn, peers=("h1",)) == "" and m.losses == ()
    raised = [(1, ExitRecord(-15)), (2, ExitRecord(1))]
    assert m.blame(raised, mpirun_failure=Failure(2, exit_code=1)) == "" and m.losses == ()


def test_several_instances_a_host_and_many_hosts_stay_one_line() -> None:
    place = {i: f"n{i // 2}" for i in range(20)}  # 10 hosts, two instances each
    clock = Clock()
    m = Membership(tuple(sorted(set(place.values()))), clock, launch_host="n0", min_hosts=2)
    m.launched(place)
    records = [(i, ExitRecord(-15)) for i in range(2, 20) if i != 9]
    records.insert(5, (9, ExitRecord(-9)))
    assert m.blame(records) == ""
    [loss] = m.losses
    assert loss.host == "n4"
    assert loss.why == (
        "instance 9 killed by SIGKILL first; the instances of 8 other hosts were ended by mpirun"
    )


def test_open_mpis_peer_report_is_read_from_its_box_and_still_shown() -> None:
    messages = MpirunMessages()
    box = [
        "-" * 74,
        "An MPI communication peer process has unexpectedly disconnected.  This",
        "usually indicates a failure in the peer process (e.g., a crash or",
        "  Local host: h2",
        "  Local PID:  3779",
        "  Peer host:  h3",
        "-" * 74,
    ]
    shown = [line for text in box for line in messages.feed_line(text + "\n")]
    assert messages.peers == ["h3"]
    assert "  Peer host:  h3" in "\n".join(shown)  # the user still reads it


def test_an_exit_line_carries_when_the_program_ended() -> None:
    assert ExitRecord.from_line(b"\x1fpoprun-exit=-9 1790000000.123456789\n") == ExitRecord(
        -9, 1790000000.123456789
    )
    # a date without %N (busybox) or none at all: the status still counts
    assert ExitRecord.from_line(b"\x1fpoprun-exit=-9 1790000000.N\n") == ExitRecord(-9)
    assert ExitRecord.from_line(b"\x1fpoprun-exit=3 \n") == ExitRecord(3)


def test_a_teardown_sigterm_first_by_the_clocks_does_not_contradict_the_named_host() -> None:
    """h4's instance was killed and its record has no time; mpirun's teardown reached h2
    0.12 s before h3. The clocks only say which teardown came first: h4 is still named."""
    placement = {0: "h1", 1: "h2", 2: "h3", 3: "h4"}
    ends = [
        End(1, "h2", -signal.SIGTERM, at=100.08),
        End(2, "h3", -signal.SIGTERM, at=100.20),
        End(3, "h4", -signal.SIGKILL),
    ]
    first = first_failure(ends, placement, mpirun_first=3)
    assert (first.host, first.instance, first.why_not) == ("h4", 3, "")
    assert TIMES not in first.by
    # an exit code that came first by the clocks still contradicts a host named otherwise
    ends[0] = End(1, "h2", 1, at=100.08)
    assert first_failure(ends, placement, mpirun_first=3).host is None
