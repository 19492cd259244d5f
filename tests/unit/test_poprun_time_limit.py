"""The time limit (pure): the save-now notice, the end before the Slurm job's, the requeue,
the exit code, and the end time read from Slurm, driven with a fake clock and fake commands."""

from __future__ import annotations

import io
import signal
import time
from collections.abc import Mapping, Sequence
from contextlib import redirect_stderr

import pytest

from poprun.cli import main
from poprun.errors import EXIT_TIME_LIMIT, EXIT_TIMEOUT, EXIT_USAGE, PoprunError
from poprun.plan.mpirun import REMOTE_WRAPPER, WRAPPER
from poprun.run.ending import GRACE_S, Action, Do, EndingPolicy, Evidence
from poprun.run.evidence import MpirunMessages
from poprun.run.signals import notice_signals
from poprun.run.time_limit import (
    END_RESERVE_S,
    NOTICE_REPEAT_S,
    NOTICE_SIGNAL,
    TimeLimit,
    job_end_time,
    parse_end_time,
    plan,
    requeue,
)
from poprun.run.verdict import RunResult, decide, ended_at_time_limit
from tests.support.fakes import Clock
from tests.support.fakes import instances as _instances

pytestmark = pytest.mark.unit


def _policy(clock: Clock, limit: TimeLimit, **kwargs: object) -> EndingPolicy:
    policy = EndingPolicy(clock, time_limit=limit, **kwargs)  # type: ignore[arg-type]
    policy.launched()
    return policy


def _dos(actions: list[Action]) -> list[Do]:
    return [a.do for a in actions]


def _end_cleanly(policy: EndingPolicy, code: int = 0) -> None:
    policy.mpirun_exited(code)
    policy.streams_closed()


# --- the notice ----------------------------------------------------------------------------


def test_the_margin_notice_comes_margin_seconds_before_the_slurm_end_and_is_repeated() -> None:
    clock = Clock()
    policy = _policy(clock, TimeLimit(margin=60, end_at=1100.0))
    assert policy.wait_s() == pytest.approx(40.0)  # 1100 - 60 - 1000
    clock.t = 1039.9
    assert policy.due() == []
    clock.t = 1040.0
    [notice] = policy.due()
    assert (notice.do, notice.signum) == (Do.NOTIFY, NOTICE_SIGNAL)
    assert "--time-limit-margin=60: the Slurm job ends in 60 s" in notice.why
    assert policy.wait_s() == pytest.approx(NOTICE_REPEAT_S)
    clock.t += NOTICE_REPEAT_S
    assert _dos(policy.due()) == [Do.NOTIFY]  # again, for an instance that was still starting
    _end_cleanly(policy)
    ending = policy.ending(Evidence(_instances()))
    assert ending.code == EXIT_TIME_LIMIT
    assert "the instances saved and stopped after the save-now notice" in ending.report
    assert f"exit code {EXIT_TIME_LIMIT}" in ending.report
    assert (ending.requeue, ending.restart) == (False, "")


def test_sigusr1_is_the_notice_once_and_requeues_after_a_clean_stop() -> None:
    clock = Clock()
    policy = _policy(clock, TimeLimit(requeue=True))
    [notice] = policy.notice_received(signal.SIGUSR1)
    assert notice.do is Do.NOTIFY and "received SIGUSR1" in notice.why
    assert policy.notice_received(signal.SIGUSR1) == []  # the repeats are the policy's
    _end_cleanly(policy)
    assert policy.notice_received(signal.SIGUSR1) == []  # nothing runs any more
    ending = policy.ending(Evidence(_instances()))
    assert (ending.code, ending.requeue) == (EXIT_TIME_LIMIT, True)


def test_a_notice_before_the_launch_is_sent_once_the_job_runs() -> None:
    clock = Clock()
    policy = EndingPolicy(clock, time_limit=TimeLimit())
    assert policy.notice_received(signal.SIGUSR1) == []
    assert policy.may_launch()  # a notice is no reason not to launch
    policy.launched()
    assert policy.wait_s() == 0.0
    [notice] = policy.due()
    assert notice.do is Do.NOTIFY and "received SIGUSR1" in notice.why


def test_without_a_notice_a_clean_end_is_exit_0_and_no_requeue() -> None:
    clock = Clock()
    policy = _policy(clock, TimeLimit(margin=30, end_at=2000.0, requeue=True))
    clock.t = 1500.0
    assert policy.due() == []
    _end_cleanly(policy)
    assert policy.wait_s() is not None  # only the drain is left to wait for
    ending = policy.ending(Evidence(_instances()))
    assert (ending.code, ending.report, ending.requeue) == (0, "", False)


def test_the_margin_counts_back_from_timeout_when_it_comes_first_and_follows_ctrl_z() -> None:
    clock = Clock()
    policy = _policy(clock, TimeLimit(margin=10, end_at=5000.0), timeout=100.0)
    assert policy.wait_s() == pytest.approx(90.0)
    policy.stopped_for(20.0)  # --timeout counts running time, and so does its notice
    clock.t = 1100.0
    assert policy.due() == []
    clock.t = 1110.0
    [notice] = policy.due()
    assert "--timeout ends in 10 s" in notice.why


# --- the end -------------------------------------------------------------------------------


def test_instances_still_running_near_the_slurm_end_are_ended_and_requeued() -> None:
    clock = Clock()
    policy = _policy(clock, TimeLimit(margin=60, end_at=1100.0, requeue=True))
    clock.t = 1040.0
    policy.due()
    stop_at = 1100.0 - END_RESERVE_S
    clock.t = stop_at
    dos = _dos(policy.due())
    assert Do.TIME_OUT in dos  # SIGTERM to mpirun and the instances, as for --timeout
    assert policy.wait_s() == pytest.approx(GRACE_S)  # then the escalation
    clock.t = stop_at + GRACE_S
    assert _dos(policy.due()) == [Do.KILL_INSTANCES]
    _end_cleanly(policy, code=143)
    ending = policy.ending(Evidence(_instances(), still_running=(1,)))
    assert (ending.code, ending.requeue) == (EXIT_TIME_LIMIT, True)
    assert "the Slurm job's end was near" in ending.report
    assert "1 (host localhost, pid 101)" in ending.report


def test_requeue_alone_ends_the_job_before_slurm_does_even_without_a_notice() -> None:
    clock = Clock()
    policy = _policy(clock, TimeLimit(end_at=1100.0, requeue=True))
    assert policy.wait_s() == pytest.approx(100.0 - END_RESERVE_S)
    clock.t = 1100.0 - END_RESERVE_S
    assert _dos(policy.due()) == [Do.TIME_OUT]
    _end_cleanly(policy, code=143)
    ending = policy.ending(Evidence(_instances(), still_running=(0, 1)))
    assert (ending.code, ending.requeue) == (EXIT_TIME_LIMIT, True)
    assert "with no notice" in ending.report


def test_a_failure_after_the_notice_is_a_failure_neither_requeued_nor_restarted() -> None:
    clock = Clock()
    policy = _policy(clock, TimeLimit(requeue=True), max_restarts=3)
    policy.notice_received(signal.SIGUSR1)
    messages = MpirunMessages()
    for line in (
        "Primary job  terminated normally, but 1 process returned",
        "a non-zero exit code. Per user-direction, the job has been aborted.",
        "mpirun detected that one or more processes exited with non-zero status, thus causing",
        "the job to be terminated. The first process to do so was:",
        "  Process name: [[1234,1],1]",
        "  Exit code:    3",
    ):
        messages.feed_line(line)
    _end_cleanly(policy, code=3)
    ending = policy.ending(Evidence(_instances(), mpirun_failure=messages.failure))
    assert ending.code == 3
    assert (ending.requeue, ending.restart) == (False, "")


def test_ctrl_c_after_the_notice_is_a_signal_ending() -> None:
    policy = _policy(Clock(), TimeLimit(requeue=True))
    policy.notice_received(signal.SIGUSR1)
    policy.signal_received(signal.SIGINT)
    _end_cleanly(policy, code=130)
    ending = policy.ending(Evidence(_instances()))
    assert (ending.code, ending.requeue) == (130, False)


def test_timeout_after_the_notice_is_the_time_limit_ending() -> None:
    result = RunResult(
        _instances(), returncode=143, timeout=60.0, timed_out=True, notice="received SIGUSR1"
    )
    assert ended_at_time_limit(result)
    code, report = decide(result)
    assert code == EXIT_TIME_LIMIT and "--timeout=60 s expired after the save-now" in report
    plain = RunResult(_instances(), returncode=143, timeout=60.0, timed_out=True)
    assert decide(plain)[0] == EXIT_TIMEOUT  # no notice: --timeout's own ending


def test_no_launch_is_never_a_time_limit_ending() -> None:
    assert not ended_at_time_limit(
        RunResult(_instances(), returncode=None, launch_error="no mpirun", at_limit=True)
    )


# --- the Slurm end time and the requeue ----------------------------------------------------


class Commands:
    """A fake runner: records each argv and env, answers from a table."""

    def __init__(self, answers: Mapping[str, tuple[int, str, str]]) -> None:
        self.answers = answers
        self.calls: list[tuple[list[str], dict[str, str]]] = []

    def __call__(self, argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, str, str]:
        self.calls.append((list(argv), dict(env)))
        return self.answers[argv[0]]


def test_end_times_in_both_of_slurms_forms_and_its_words_for_none() -> None:
    assert parse_end_time("SLURM_JOB_END_TIME", "1764100000") == 1764100000.0
    local = time.mktime(time.strptime("2026-11-25T20:15:03", "%Y-%m-%dT%H:%M:%S"))
    assert parse_end_time("squeue", "2026-11-25T20:15:03\n") == local
    for none in ("Unknown", "N/A", "NONE", "", "0", "UNLIMITED"):
        assert parse_end_time("squeue", none) is None
    with pytest.raises(PoprunError, match="squeue=11/25 20:15: is not an end time"):
        parse_end_time("squeue", "11/25 20:15")


def test_the_end_time_comes_from_the_variable_else_from_squeue() -> None:
    commands = Commands({"squeue": (0, "2026-11-25T20:15:03\n", "")})
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_END_TIME": "1764100000"}
    assert job_end_time(env, commands) == 1764100000.0
    assert commands.calls == []  # Slurm said it: no squeue
    del env["SLURM_JOB_END_TIME"]
    env["SLURM_TIME_FORMAT"] = "relative"  # the user's taste must not change what we parse
    assert job_end_time(env, commands) is not None
    [(argv, seen)] = commands.calls
    assert argv == ["squeue", "-h", "-j", "42", "-o", "%e"]
    assert seen["SLURM_TIME_FORMAT"] == "standard"
    assert job_end_time({}, commands) is None  # not a Slurm job
    failing = Commands({"squeue": (1, "", "slurm_load_jobs error: Invalid job id specified\n")})
    with pytest.raises(PoprunError, match="Invalid job id specified"):
        job_end_time({"SLURM_JOB_ID": "42"}, failing)


def test_plan_puts_the_end_on_the_policys_clock_and_reads_it_only_when_asked() -> None:
    end = time.time() + 300.0
    commands = Commands({"squeue": (0, "", "")})
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_END_TIME": str(int(end))}
    limit = plan(30.0, False, env, lambda: 50.0, commands)
    assert limit.end_at == pytest.approx(50.0 + int(end) - time.time(), abs=1.0)
    assert plan(None, False, env, lambda: 50.0, commands).end_at is None  # not asked
    assert commands.calls == []


def test_requeue_runs_scontrol_and_says_why_when_it_cannot() -> None:
    done = Commands({"scontrol": (0, "", "")})
    assert requeue({"SLURM_JOB_ID": "42"}, done) == ""
    assert done.calls[0][0] == ["scontrol", "requeue", "42"]
    refused = Commands({"scontrol": (1, "", "scontrol: error: Requested operation is disabled\n")})
    line = requeue({"SLURM_JOB_ID": "42"}, refused)
    assert "could not requeue Slurm job 42" in line and "operation is disabled" in line


# --- the options, the signal, the wrappers, mpirun's echo --------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--requeue-on-timeout", "true"], ["--requeue-on-timeout=yes", "SLURM_JOB_ID"]),
        (["--time-limit-margin=-5", "true"], ["--time-limit-margin=-5", "more than 0"]),
        (["--time-limit-margin", "30", "true"], ["--time-limit-margin=30", "--timeout"]),
        (
            ["--timeout", "20", "--time-limit-margin", "30", "true"],
            ["--time-limit-margin=30", "not shorter than --timeout=20"],
        ),
    ],
)
def test_bad_time_limit_options_are_one_line_and_exit_2(
    argv: list[str], words: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    err = io.StringIO()
    with redirect_stderr(err):
        assert main(argv) == EXIT_USAGE
    text = err.getvalue()
    assert text.count("\n") == 1 and text.startswith("poprun: error: "), text
    for word in words:
        assert word in text, text


def test_sigusr1_is_the_notice_only_in_a_slurm_job() -> None:
    assert notice_signals({"SLURM_JOB_ID": "3"}) == (signal.SIGUSR1,)
    assert notice_signals({}) == ()


def test_the_wrappers_start_the_program_with_the_notice_ignored() -> None:
    for wrapper in (WRAPPER, REMOTE_WRAPPER):
        script = wrapper[2]
        assert script.index('trap "" USR1') < script.index('exec "$@"')
    # the first traps come before the program starts (after the wrapper's own variables)
    script = REMOTE_WRAPPER[2]
    assert script.index('trap true HUP INT TERM; trap "" USR1;') < script.index("/bin/sh -c")


def test_mpiruns_echo_of_the_forwarded_notice_is_not_shown() -> None:
    messages = MpirunMessages()
    assert messages.feed_line("mpirun: Forwarding signal 10 to job\n") == []
    assert messages.feed_line("mpirun: something else\n") == ["mpirun: something else"]
