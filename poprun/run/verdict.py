"""The verdict on a finished run (pure): its record → poprun's exit code and root-cause report.

The ending policy (:mod:`poprun.run.ending`) fills a :class:`RunResult` from the events it
decided on and the evidence the supervisor collected (:mod:`poprun.run.evidence`);
:func:`decide` turns that record into poprun's exit code and the text it prints. Every
branch (signals, time-out, first failure, unknown status, error records, escalation) is a
plain function of the record, so each is unit-tested without a process.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from typing import NamedTuple

from poprun import summary
from poprun.errors import EXIT_LAUNCH_FAILED, EXIT_TIME_LIMIT, EXIT_TIMEOUT
from poprun.run.evidence import ErrorRecord, ExitRecord, Failure
from poprun.run.membership.blame import End, first_failure


class InstanceResult(NamedTuple):
    """One instance as the supervisor last saw it."""

    index: int  # type: ignore[assignment]  # a field, not tuple.index
    host: str
    pid: int | None = None
    #: The last lines of its stderr (the report's fallback when there is no error record).
    stderr_tail: tuple[str, ...] = ()
    #: Its own structured record of an uncaught exception, if it wrote one.
    error: ErrorRecord | None = None
    #: When its error record (or else a Python traceback) reached poprun (monotonic s).
    raised_at: float | None = None


class RunResult(NamedTuple):
    """Everything known at the end of a run (the policy's events, the supervisor's evidence)."""

    instances: tuple[InstanceResult, ...]
    #: mpirun's exit status (``Popen.returncode``: negative for a signal); None: never started.
    returncode: int | None
    #: Why mpirun could not be started, when it could not.
    launch_error: str | None = None
    #: Signals poprun received, in order (the first was forwarded, a second killed the job).
    signals: tuple[int, ...] = ()
    #: ``--timeout`` in seconds, and whether it expired.
    timeout: float | None = None
    timed_out: bool = False
    #: Instances still running when the time-out expired.
    still_running: tuple[int, ...] = ()
    #: The first failure mpirun's own messages named, if they named one.
    mpirun_failure: Failure | None = None
    #: Local instances that had ended when mpirun announced the abort, in the order they ended;
    #: None when mpirun never announced one.
    exited_at_abort: tuple[int, ...] | None = None
    #: What instances on other hosts reported of their ending, in the order it arrived...
    exit_records: tuple[tuple[int, ExitRecord], ...] = ()
    #: ... and how many of those had arrived when mpirun announced the abort (None: never).
    exit_records_at_abort: int | None = None
    #: Whether poprun had to SIGKILL instances (or mpirun) after the grace period.
    escalated: bool = False
    #: Instances on other hosts (poprun sees neither their pids nor their exits).
    remote: tuple[int, ...] = ()
    #: Processes the job left behind (an instance's children), which poprun killed.
    left_behind: tuple[str, ...] = ()
    #: mpirun's pid, and whether poprun itself SIGKILLed it.
    mpirun_pid: int | None = None
    mpirun_killed_by_poprun: bool = False
    #: Why poprun sent the instances the save-now notice ("" when it did not).
    notice: str = ""
    #: Whether poprun ended the job because the Slurm job's end was near.
    at_limit: bool = False


def decide(result: RunResult) -> tuple[int, str]:
    """poprun's exit code and the report to print on stderr ("" when there is nothing to say)."""
    code, report = _decide(result)
    if result.left_behind:
        note = (
            f"poprun: killed what the instances left behind: {'; '.join(result.left_behind)} "
            "(their children, still running after them or holding their output open)"
        )
        report = f"{report}\n{note}" if report else note
    return code, report


def _decide(result: RunResult) -> tuple[int, str]:
    if result.returncode is None and result.launch_error is None and result.signals:
        code = 128 + result.signals[0]
        name = _signal_name(result.signals[0])
        return (
            code,
            f"poprun: received {name} before the job started; nothing was launched; exit code {code}",
        )
    if result.returncode is None:
        return EXIT_LAUNCH_FAILED, f"poprun: cannot start mpirun: {result.launch_error}"
    if result.signals:
        return _signalled(result.signals)
    if ended_at_time_limit(result):
        return _time_limit(result)
    if result.timed_out:
        return _timed_out(result)
    failure = root_cause(result)
    if failure is not None and 0 <= failure.instance < len(result.instances):
        return _failed(result, failure)
    if result.returncode < 0:
        code = 128 - result.returncode
        if result.mpirun_killed_by_poprun:
            return code, ""
        pid = f" (pid {result.mpirun_pid})" if result.mpirun_pid is not None else ""
        return code, (
            f"poprun: mpirun{pid} was killed by {_signal_name(-result.returncode)} before "
            f"the job ended; its instances were ended too; exit code {code}"
        )
    if result.returncode > 0 and result.mpirun_failure is None and result.remote:
        # mpirun aborted without naming the process (it leaves the note out when an instance
        # fails before all have started), no instance there reported its status (its wrapper
        # was killed), and the instances here are not it.
        where = _listed(result, result.remote, lambda i: f"{i} ({result.instances[i].host})")
        return result.returncode, (
            f"poprun: an instance on another host failed first with exit code "
            f"{result.returncode}; mpirun did not say which (instances on other hosts: {where})\n"
            f"poprun: ended every other instance of the job; exit code {result.returncode}"
        )
    return result.returncode, ""


def _signalled(signals: tuple[int, ...]) -> tuple[int, str]:
    code = 128 + signals[0]
    name = _signal_name(signals[0])
    if len(signals) > 1:
        again = _signal_name(signals[1])
        return code, (
            f"poprun: received {name}, then {again}: killed the job at once; exit code {code}"
        )
    return code, f"poprun: received {name}; ended the job; exit code {code}"


def _listed(result: RunResult, indices: Sequence[int], one: Callable[[int], str]) -> str:
    """``indices`` each as ``one`` says, or past :data:`poprun.summary.THRESHOLD` their
    count, index ranges and hosts, then the first :data:`poprun.summary.TOP` of them."""
    if not summary.summarised(len(indices)):
        return ", ".join(map(one, indices))
    names = [result.instances[i].host for i in indices]
    first = ", ".join(one(i) for i in indices[: summary.TOP])
    return (
        f"{summary.count(len(indices), 'instance')} ({summary.ranges(indices)}) on "
        f"{summary.count(len(set(names)), 'host')} ({summary.hosts(names)}); the first "
        f"{summary.TOP}: {first}"
    )


def _running(result: RunResult) -> str:
    """The instances still running, each with its host and pid (summed up past many)."""
    return _listed(
        result,
        result.still_running,
        lambda i: f"{i} (host {result.instances[i].host}, pid {_pid(result.instances[i])})",
    )


def _timed_out(result: RunResult) -> tuple[int, str]:
    running = _running(result)
    return EXIT_TIMEOUT, (
        f"poprun: --timeout={result.timeout or 0:g} s expired; "
        f"instances still running: {running or 'none'}\n"
        f"poprun: ended the job; exit code {EXIT_TIMEOUT}"
    )


def ended_at_time_limit(result: RunResult) -> bool:
    """Whether the job ended at its time limit (exit :data:`EXIT_TIME_LIMIT`, requeue-able).

    So it did when poprun ended it before the Slurm job's end, and when, after the save-now
    notice, the instances stopped by themselves or ran into ``--timeout``. A failure after
    the notice stays a failure (signals, and a launch that never happened, come first).
    """
    if result.returncode is None or result.signals:
        return False
    return result.at_limit or bool(result.notice and (result.returncode == 0 or result.timed_out))


def _time_limit(result: RunResult) -> tuple[int, str]:
    notice = f"after the save-now notice ({result.notice})" if result.notice else "with no notice"
    if not (result.at_limit or result.timed_out):
        how = f"poprun: the instances saved and stopped {notice}"
    else:
        running = _running(result)
        end = (
            "the Slurm job's end was near"
            if result.at_limit
            else f"--timeout={result.timeout or 0:g} s expired"
        )
        how = f"poprun: {end} {notice}; ended the instances still running: {running or 'none'}"
    return EXIT_TIME_LIMIT, (
        f"{how}\npoprun: the job ended at its time limit; exit code {EXIT_TIME_LIMIT} "
        "(run it again to resume from its last checkpoint)"
    )


def diagnosed(code: int, report: str, diagnosis: str, *, hung: bool) -> tuple[int, str]:
    """The exit code and report of a job poprun ended on a verdict of its progress board.

    ``hung`` (``--hang-timeout``): exit :data:`~poprun.errors.EXIT_TIMEOUT` and the hang
    report, whatever the instances' ends (poprun's SIGTERM) say. A desync: the report names
    the two collectives; when an instance's collective had already failed (its own exit code),
    its root-cause report follows, else the job ends with exit code 1.
    """
    if hung:
        return EXIT_TIMEOUT, f"{diagnosis}\npoprun: ended the job; exit code {EXIT_TIMEOUT}"
    if code > 0 and " raised " in report:
        return code, f"{diagnosis}\n{report}" if diagnosis else report
    ended = f"poprun: ended the job; exit code {EXIT_LAUNCH_FAILED}"
    return EXIT_LAUNCH_FAILED, f"{diagnosis}\n{ended}" if diagnosis else ended


def root_cause(result: RunResult) -> Failure | None:
    """The instance that failed first, and how, or None when nothing failed.

    An instance that raised (its error record, else its traceback) is the root cause even
    when another ended first: under Horovod an exception on one instance shuts the others
    down, and those may exit before it. Of several that raised, one whose exception only
    echoes a peer's failure (:func:`echoes_a_peer`) comes after the others. Otherwise
    mpirun's own note names the instance; without it, the remote instance that how (and when)
    the remote instances ended names as the first (:func:`first_by_ends`), else the first
    instance on another host whose exit record says it failed (:func:`reported_failure`);
    else the last local instance to end before the abort, with mpirun's status as its code.
    """
    failure = (
        result.mpirun_failure
        or first_by_ends(result)
        or reported_failure(result, certain_only=True)
        or _last_before_abort(result)
        or reported_failure(result)
    )
    raised = sorted(
        (echoes_a_peer(i), i.raised_at, i.index)
        for i in result.instances
        if i.raised_at is not None
    )
    if raised and (failure is None or raised[0][2] != failure.instance):
        first = raised[0][2]
        own = dict(result.exit_records).get(first)
        if own is not None and own.failed:
            return own.failure(first)
        if failure is None:
            code = result.returncode or 0
            return Failure(first, exit_code=code if 0 < code <= 128 else 1)
        return Failure(first, failure.exit_code, failure.signal, failure.status_known)
    return failure


def first_by_ends(result: RunResult) -> Failure | None:
    """The remote instance whose end came first by the evidence of the ends themselves (an own
    signal against mpirun's SIGTERMs, the end times: :func:`~poprun.run.membership.blame.first_failure`),
    whatever order the records arrived in; None when they cannot tell."""
    hosts = {instance.index: instance.host for instance in result.instances}
    records = dict(result.exit_records)
    ends = [End(i, hosts[i], r.returncode, r.ended_at) for i, r in records.items() if i in hosts]
    first = first_failure(ends, hosts)
    if first.instance is None or first.instance not in records:
        return None
    return records[first.instance].failure(first.instance)


def reported_failure(result: RunResult, *, certain_only: bool = False) -> Failure | None:
    """The first instance on another host whose exit record says it failed.

    ``certain_only``: only a record that cannot be mpirun ending that instance: one that
    arrived before mpirun announced the abort, or an ending other than SIGTERM or SIGKILL
    (what mpirun sends every instance when it ends the job).
    """
    for n, (instance, record) in enumerate(result.exit_records):
        if not record.failed:
            continue
        before_abort = result.exit_records_at_abort is None or n < result.exit_records_at_abort
        if not certain_only or before_abort or not record.ended_by_the_job:
            return record.failure(instance)
    return None


def _last_before_abort(result: RunResult) -> Failure | None:
    """The last local instance to end before mpirun announced the abort (mpirun's status)."""
    if not result.exited_at_abort:
        return None
    last = result.exited_at_abort[-1]
    code = result.returncode or 0
    if code > 128:
        return Failure(last, signal=code - 128)
    if code > 0:
        return Failure(last, exit_code=code)
    return Failure(last, status_known=False)  # mpirun was ended before it said


#: What an instance raises when a *peer* failed and the collective backend shut down: such
#: an exception is an echo, never the root cause while another instance raised too. (Across
#: hosts the echo on the launch host often reaches poprun before the remote root cause.)
PEER_FAILED = (
    "Horovod has been shut down",  # Horovod, after an exception on another rank
    "Connection closed by peer",  # gloo (torch.distributed), a peer exited
    "Connection reset by peer",
)


def echoes_a_peer(instance: InstanceResult) -> bool:
    """Whether the instance raised only because another one failed (see :data:`PEER_FAILED`)."""
    if instance.error is not None:
        text = instance.error.message
    else:
        text = "\n".join(instance.stderr_tail[-3:])
    return any(phrase in text for phrase in PEER_FAILED)


def _failed(result: RunResult, failure: Failure) -> tuple[int, str]:
    code = failure.poprun_exit_code
    if failure.exit_code is None and failure.signal is None:
        code = max(result.returncode or 0, 0) or 1
    instance = result.instances[failure.instance]
    report = failure_report(
        failure,
        host=instance.host,
        pid=instance.pid if instance.pid is not None else _record_pid(instance),
        tail=list(instance.stderr_tail),
        error=instance.error,
        exit_code=code,
    )
    if result.escalated:
        report += "\npoprun: the job did not end by itself in time: poprun sent SIGKILL"
    return code, report


def _record_pid(instance: InstanceResult) -> int | None:
    return instance.error.pid if instance.error is not None else None


def _pid(instance: InstanceResult) -> str:
    return str(instance.pid) if instance.pid is not None else "unknown"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def failure_report(
    failure: Failure,
    *,
    host: str,
    pid: int | None,
    tail: list[str],
    exit_code: int,
    error: ErrorRecord | None = None,
) -> str:
    """The root-cause report printed when an instance fails."""
    where = f"host {host}, pid {pid if pid is not None else 'unknown'}"
    lines = [f"poprun: instance {failure.instance} failed first: {failure.describe()} ({where})"]
    if error is not None:
        message = f"{error.type}: {error.message}" if error.message else error.type
        lines.append(f"poprun: instance {failure.instance} raised {message}")
        lines.extend(f"    {line}" for line in error.traceback.rstrip("\n").splitlines())
    elif tail:
        lines.append(f"poprun: last {len(tail)} lines of instance {failure.instance}'s stderr:")
        lines.extend(f"    {line}" for line in tail)
    else:
        lines.append(f"poprun: instance {failure.instance} wrote nothing to stderr")
    lines.append(f"poprun: ended every other instance of the job; exit code {exit_code}")
    return "\n".join(lines)
