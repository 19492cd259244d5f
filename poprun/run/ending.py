"""The ending policy (pure): from one run's events and a clock, what to do next and how it ends.

Every way a run ends goes through :class:`EndingPolicy`: an instance fails (mpirun announces
the abort, or exits; an instance on another host reports how it ended), a signal reaches poprun (a second one too), ``--timeout`` passes, the
output streams close or stay open after mpirun has gone, a failed job is launched again
(``--max-restarts``), the time limit nears (the save-now notice, then the end before the
Slurm job's: :mod:`poprun.run.time_limit`). The supervisor (:mod:`poprun.run.supervisor`)
tells the policy what happened and carries out the :class:`Action` s it answers with; it
keeps no timer and makes no choice of its own. At the end :meth:`EndingPolicy.ending` gives the exit code, the report
(:func:`poprun.run.verdict.decide`) and whether to launch the job again.

The policy reads time only from the clock it is given, starts no process and makes no
system call: its unit tests drive it with a fake clock, event by event.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from poprun.errors import EXIT_HOSTS_LOST
from poprun.run import verdict
from poprun.run.evidence import ExitRecord, Failure
from poprun.run.progress.hang import Hang, HangWatch
from poprun.run.time_limit import NOTICE_SIGNAL, TimeLimit
from poprun.run.verdict import InstanceResult, RunResult, decide, ended_at_time_limit

if TYPE_CHECKING:
    from poprun.run.membership.members import Membership

#: After the first failure, a signal or the time-out: how long mpirun gets to end the job
#: itself before poprun SIGKILLs every instance it knows on this host...
GRACE_S = 1.5
#: ... or, when some instances run on other hosts, this long: mpirun needs about 2 s to end
#: a multi-host job (its daemons there end their instances and report back over ssh), and
#: poprun cannot kill remote instances itself.
REMOTE_GRACE_S = 5.0
#: ... and how long mpirun then gets, once its instances are killed, before it is killed too.
MPIRUN_GRACE_S = 0.8
#: A lost host: how long mpirun gets before it is killed with the instances. The survivors
#: wait in a collective for the lost ones (inside Horovod's or MPI's wait, where no Python
#: signal handler runs) and the checkpoint is already on disk: a grace would only delay the
#: relaunch. Killing mpirun ends the survivors' daemons on the other hosts, which end their
#: instances.
LOST_GRACE_S = 0.2
#: Once mpirun has exited: how long its output may take to reach its end (a pipe held open
#: by a stray grandchild is given up on after this).
DRAIN_S = 1.0
#: ... or this long when the job ended on a lost host: the survivors were killed, their last
#: words are in the pipes already, and a surviving host's ssh session (its master holds
#: mpirun's output open) ends only once Open MPI's daemon there has noticed mpirun is gone.
LOST_DRAIN_S = 0.2
#: The longest single wait the supervisor makes: a far deadline (any ``--timeout``, days or
#: years) is reached in steps, each well inside what ``epoll`` can wait (24.8 days).
STEP_S = 3600.0


class Do(enum.Enum):
    """What the supervisor is told to do."""

    #: Send ``signum`` to mpirun and SIGTERM to the local instances (the first signal).
    FORWARD = "forward"
    #: The time-out (or the Slurm job's end is near): note the instances still running,
    #: SIGTERM mpirun and the instances.
    TIME_OUT = "time-out"
    #: SIGKILL the local instances (their shared-memory files noted first); with
    #: ``groups``, their process groups too (a second signal).
    KILL_INSTANCES = "kill-instances"
    #: SIGKILL mpirun's session and the instances: it did not end in its grace period.
    KILL_MPIRUN = "kill-mpirun"
    #: mpirun has exited: kill what it left holding its pipes, read every FIFO once.
    DRAIN = "drain"
    #: Stop waiting for the output: every stream ended, or the drain deadline passed.
    STOP_READING = "stop-reading"
    #: ``--hang-timeout`` passed without progress: print the hang verdict, end the job (124).
    HANG = "hang"
    #: ... with ``--on-hang=report``: print the verdict, leave the job running.
    HANG_REPORT = "hang-report"
    #: Part of the way there: a note naming an instance the others wait for, if there is one.
    NOTE = "note"
    #: Two instances issued different collectives at one sequence number: end the job now.
    DESYNC = "desync"
    #: Send mpirun ``signum`` (SIGUSR1), which it forwards to every instance: save now.
    NOTIFY = "notify"
    #: A host is lost (:mod:`poprun.run.membership`): say so, end the job as at the time-out
    #: with ``signum`` (none: mpirun is already ending it; KILL_MPIRUN follows at once).
    HOST_LOST = "host-lost"


class Action(NamedTuple):
    """One decision: what to do, and the log line that says why."""

    do: Do
    why: str
    signum: int = 0
    groups: bool = False


class Ending(NamedTuple):
    """How a run (or an attempt of it) ended: the exit code, the report, and what comes next."""

    code: int
    report: str
    #: Launch the job again (``--max-restarts``): this line says so on stderr.
    restart: str = ""
    #: Put the Slurm job back in the queue (``--requeue-on-timeout``, after the time limit).
    requeue: bool = False
    #: Launch again on these hosts (a host was lost: ``--min-hosts``); empty: the same ones.
    hosts: tuple[str, ...] = ()


class Evidence(NamedTuple):
    """What the supervisor saw that names the failing instance (for :meth:`EndingPolicy.ending`)."""

    instances: tuple[InstanceResult, ...]
    mpirun_failure: Failure | None = None
    still_running: tuple[int, ...] = ()
    left_behind: tuple[str, ...] = ()
    remote: tuple[int, ...] = ()
    mpirun_pid: int | None = None
    #: The hang or desync verdict the supervisor printed (:mod:`poprun.run.progress`).
    diagnosis: str = ""
    #: The hosts Open MPI's peer reports name as gone, in order (mpirun's text).
    peers: tuple[str, ...] = ()


class _Attempt:
    """The events of one launch of the job (a restart starts a new one)."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.kill_at: float | None = None
        self.drain_until: float | None = None
        self.signals: list[int] = []
        self.exited: list[int] = []
        self.exited_at_abort: tuple[int, ...] | None = None
        self.reports: list[tuple[int, ExitRecord]] = []
        self.reports_at_abort: int | None = None
        #: How many had arrived when poprun itself began killing (what ends later is its doing).
        self.reports_at_kill: int | None = None
        self.returncode: int | None = None
        self.launch_error: str | None = None
        self.timed_out = self.instances_killed = self.escalated = False
        self.mpirun_killed = self.started = False
        self.streams_open = self.reading = True
        #: Ended on a verdict of the progress board (:mod:`poprun.run.progress`).
        self.hung = self.desynced = False
        #: Ended because a host was lost (:mod:`poprun.run.membership`), or stopped at the
        #: save-now notice to readmit one (``--readmit``).
        self.lost = self.readmitting = False
        #: An instance has made progress (a collective or a step) in this attempt.
        self.moved = False
        #: ``--sigterm-grace``: when the SIGTERM that came is forwarded, if the job still runs.
        self.forward_at: float | None = None


class EndingPolicy:
    """Decides, from events and ``clock`` (monotonic seconds), how a run ends."""

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        timeout: float | None = None,
        remote: bool = False,
        max_restarts: int = 0,
        time_limit: TimeLimit | None = None,
        sigterm_grace: float | None = None,
    ) -> None:
        self.clock = clock
        #: ``--sigterm-grace``: SIGTERM is the save-now notice first, forwarded this late.
        self.sigterm_grace = sigterm_grace
        #: The save-now notice and the end before the Slurm job's (job-wide, not per attempt).
        self.time_limit = time_limit or TimeLimit()
        self.timeout = timeout
        self.max_restarts = max_restarts
        #: How long mpirun gets to end the job itself (longer across hosts).
        self.grace_s = REMOTE_GRACE_S if remote else GRACE_S
        self.hang = HangWatch()  # --hang-timeout, --on-hang: the supervisor sets them
        self.membership: Membership | None = None  # a job across hosts: the supervisor sets it
        #: Restarts used so far.
        self.restarts = 0
        self.now = _Attempt()

    # --- events -------------------------------------------------------------------------

    def launched(self, at: float | None = None) -> None:
        """mpirun was started, ``at`` (on :attr:`clock`) or now: the time-out counts from then."""
        self.now.started = True
        self.hang.reset()
        if self.timeout is not None:
            self.now.deadline = (self.clock() if at is None else at) + self.timeout

    def may_launch(self) -> bool:
        """False once a signal has arrived: the job is not launched at all."""
        return not self.now.signals

    def launch_failed(self, error: str) -> None:
        """mpirun could not be started."""
        self.now.launch_error = error
        self.now.reading = False

    def signal_received(self, signum: int) -> list[Action]:
        """SIGINT/SIGTERM/SIGHUP: the first is forwarded (a SIGTERM with ``--sigterm-grace``
        is held back for the grace, the instances told to save now), a second kills the
        instances at once and cancels a SIGTERM still held back."""
        now = self.now
        now.signals.append(signum)
        name = _name(signum)
        if not now.started or now.returncode is not None:
            return []  # no job, or it has ended: the signal only sets the exit code
        if len(now.signals) == 1 and signum == signal.SIGTERM and self.sigterm_grace:
            return _save_first(self, name)
        if len(now.signals) == 1:
            now.kill_at = self._sooner(now.kill_at, self.clock() + self.grace_s)
            return [Action(Do.FORWARD, f"received {name}: forwarding it to mpirun", signum)]
        now.instances_killed = True
        now.forward_at = None  # the held-back SIGTERM: nothing left to forward it to
        now.kill_at = self.clock() + MPIRUN_GRACE_S
        return [
            Action(
                Do.KILL_INSTANCES, f"received {name} again: killing the instances now", groups=True
            )
        ]

    def notice_received(self, signum: int) -> list[Action]:
        """SIGUSR1 in a Slurm job (``--signal=B:USR1@N``): the instances are told to save now."""
        running = self.now.started and self.now.returncode is None
        why = self.time_limit.received(f"received {_name(signum)}", self.clock(), running=running)
        return [_notify(why)] if why else []

    def stopped_for(self, seconds: float) -> None:
        """poprun was stopped (Ctrl-Z) this long: ``--timeout`` counts running time only."""
        if self.now.deadline is not None:
            self.now.deadline += seconds
        self.hang.stopped_for(seconds)  # a stopped job is not hung either

    def progressed(self, moved: bool, *, finishing: bool = False) -> None:
        """A progress record arrived: ``moved`` (progress), ``finishing`` (all programs ended)."""
        self.hang.progressed(moved, self.clock(), finishing=finishing)
        self.now.moved = self.now.moved or moved

    def desynced(self) -> list[Action]:
        """Two instances issued different collectives at one sequence number: end the job."""
        now = self.now
        if now.desynced or not now.started or now.returncode is not None:
            return []
        now.desynced = True
        now.kill_at = self._sooner(now.kill_at, self.clock() + self.grace_s)
        return [Action(Do.DESYNC, "the instances issued different collectives: ending the job")]

    def instance_exited(self, instance: int) -> None:
        """A local instance ended (the order matters when mpirun names no one)."""
        self.now.exited.append(instance)

    def exit_reported(self, instance: int, record: ExitRecord) -> None:
        """An instance on another host said how it ended (its wrapper's last stderr line):
        before mpirun's abort, after it, even after mpirun has exited (it counts until the
        output ends). While nothing else ends the job the membership hears it too."""
        now = self.now
        now.reports.append((instance, record))
        if self.membership is not None and _unprovoked(now):
            self.membership.exited(instance, record.returncode)

    def mpirun_aborting(self) -> None:
        """mpirun announced it is ending the job: it gets the grace period to finish (and
        every host of a job across hosts is asked at once whether it is there)."""
        now = self.now
        if now.exited_at_abort is None:
            now.exited_at_abort, now.reports_at_abort = tuple(now.exited), len(now.reports)
            if self.membership is not None:
                self.membership.failing()
        now.kill_at = self._sooner(now.kill_at, self.clock() + self.grace_s)

    def mpirun_exited(self, returncode: int) -> list[Action]:
        """mpirun is gone: nothing more to kill; its output gets :data:`DRAIN_S` to end."""
        now = self.now
        now.returncode = returncode
        now.kill_at = None
        now.deadline = None
        now.drain_until = self.clock() + (LOST_DRAIN_S if now.lost else DRAIN_S)
        actions = [Action(Do.DRAIN, f"mpirun exited with status {returncode}")]
        return actions + self._maybe_stop_reading()

    def streams_closed(self) -> list[Action]:
        """Every output stream reached its end."""
        self.now.streams_open = False
        return self._maybe_stop_reading()

    def due(self) -> list[Action]:
        """What the clock now calls for: the time-out, an escalation, the end of the drain."""
        now = self.now
        if not now.reading:
            return []
        t = self.clock()
        actions: list[Action] = []
        if now.started and now.returncode is None:
            actions += _time_limit_actions(self, t) + _forward_actions(now, t, self.grace_s)
        if now.deadline is not None and t >= now.deadline and now.returncode is None:
            now.deadline = None
            now.timed_out = True
            now.kill_at = self._sooner(now.kill_at, t + self.grace_s)
            actions.append(
                Action(Do.TIME_OUT, f"--timeout={self.timeout:g} expired: ending the job")
            )
        if now.kill_at is not None and t >= now.kill_at and now.returncode is None:
            actions.append(_escalate(self, t))
        if now.started and now.returncode is None:
            actions += _lost_actions(self, t) + _hang_actions(self, t)
        if now.drain_until is not None and t >= now.drain_until:
            now.reading = False
            actions.append(Action(Do.STOP_READING, "mpirun has exited; its output did not end"))
        return actions

    # --- questions ----------------------------------------------------------------------

    @property
    def reading(self) -> bool:
        """Whether the supervisor should go on waiting for events."""
        return self.now.reading

    def wait_s(self) -> float | None:
        """How long the supervisor may wait for the next event (None: until one comes)."""
        now = self.now
        running = now.returncode is None
        limit = self.time_limit.next_time(now.deadline) if running else None
        hang = self.hang.next_check() if running else None
        forward = now.forward_at if running else None
        times = (now.deadline, now.kill_at, now.drain_until, limit, hang, forward)
        soonest = min((t for t in times if t is not None), default=None)
        if soonest is None:
            return None
        return min(max(0.0, soonest - self.clock()), STEP_S)

    def ending(self, evidence: Evidence) -> Ending:
        """The exit code and report of this attempt, and whether to launch the job again."""
        now = self.now
        result = RunResult(
            instances=evidence.instances,
            returncode=now.returncode,
            launch_error=now.launch_error,
            signals=tuple(now.signals),
            timeout=self.timeout,
            timed_out=now.timed_out,
            still_running=evidence.still_running,
            mpirun_failure=evidence.mpirun_failure,
            exited_at_abort=now.exited_at_abort,
            exit_records=tuple(now.reports),
            exit_records_at_abort=now.reports_at_abort,
            escalated=now.escalated,
            remote=evidence.remote,
            left_behind=evidence.left_behind,
            mpirun_pid=evidence.mpirun_pid,
            mpirun_killed_by_poprun=now.mpirun_killed,
            notice=self.time_limit.noticed,
            at_limit=self.time_limit.at_limit,
        )
        code, report = decide(result)
        if now.hung or now.desynced:
            code, report = verdict.diagnosed(code, report, evidence.diagnosis, hung=now.hung)
        note = _blame(self, evidence)
        if note:
            report = f"{report}\n{note}" if report else note
        ended_by_poprun = (
            bool(now.signals)
            or now.timed_out
            or now.hung
            or now.desynced
            or bool(self.time_limit.noticed)
        )
        membership = self.membership
        if membership and not now.signals and (membership.losses or (now.readmitting and not code)):
            return _after_loss(self, membership)
        if ended_at_time_limit(result):
            return Ending(code, report, requeue=self.time_limit.requeue)
        if code == 0 or ended_by_poprun or self.restarts >= self.max_restarts:
            return Ending(code, report)
        self.restarts += 1
        self.now = _Attempt()
        return Ending(
            code,
            report,
            restart=(
                f"poprun: the job failed with exit code {code}: restarting the job "
                f"(restart {self.restarts} of {self.max_restarts})"
            ),
        )

    # --- inside -------------------------------------------------------------------------

    def _maybe_stop_reading(self) -> list[Action]:
        now = self.now
        if now.returncode is None or now.streams_open or not now.reading:
            return []
        now.reading = False
        return [Action(Do.STOP_READING, "mpirun has exited and its output has ended")]

    @staticmethod
    def _sooner(current: float | None, candidate: float) -> float:
        return candidate if current is None else min(current, candidate)


def _escalate(policy: EndingPolicy, t: float) -> Action:
    """Past the grace period: first the instances (mpirun then reports and exits by
    itself, in well under a second), then mpirun too."""
    now = policy.now
    now.escalated = True
    if now.reports_at_kill is None:
        now.reports_at_kill = len(now.reports)
    if now.instances_killed:
        now.kill_at = None
        now.mpirun_killed = True
        return Action(
            Do.KILL_MPIRUN,
            "the job did not end in time: sending SIGKILL to mpirun and its instances",
        )
    now.instances_killed = True
    now.kill_at = t + MPIRUN_GRACE_S
    return Action(
        Do.KILL_INSTANCES, "the job did not end in time: sending SIGKILL to the instances"
    )


def _blame(policy: EndingPolicy, evidence: Evidence) -> str:
    """A job across hosts (``--min-hosts``) that failed by itself, with no host lost yet:
    the membership judges whose failure came first, from every exit record (mpirun's
    teardown among them: told apart by how they ended, not by when they arrived), and
    loses that host where its instances were killed; a line when it cannot tell."""
    now, membership = policy.now, policy.membership
    ended_by_poprun = now.signals or now.timed_out or now.hung or now.desynced or now.lost
    if membership is None or ended_by_poprun or policy.time_limit.noticed or now.readmitting:
        return ""
    if now.returncode in (0, None):
        return ""
    records = now.reports[: now.reports_at_kill]  # later ones: poprun's own kill
    return membership.blame(records, mpirun_failure=evidence.mpirun_failure, peers=evidence.peers)


def _unprovoked(now: _Attempt) -> bool:
    """Nothing has begun to end the attempt (an abort, a signal, the time-out, a verdict), and
    no local instance has ended (poprun does not see its status): a remote instance's end is
    then evidence about its host."""
    return now.kill_at is None and now.returncode is None and not now.exited


def _save_first(policy: EndingPolicy, name: str) -> list[Action]:
    """SIGTERM with ``--sigterm-grace`` (a pod deleted, a PBS or LSF job ended): the save-now
    notice now, on the time limit's path (sent again until the job ends), and SIGTERM to
    mpirun only if the job still runs when the grace has passed."""
    now = policy.now
    grace = policy.sigterm_grace or 0.0
    now.forward_at = policy.clock() + grace
    why = policy.time_limit.received(
        f"received {name} (--sigterm-grace={grace:g})", policy.clock(), running=True
    )
    return [_notify(why)] if why else []


def _forward_actions(now: _Attempt, t: float, grace_s: float) -> list[Action]:
    """The SIGTERM held back by ``--sigterm-grace``, once its grace has passed."""
    if now.forward_at is None or t < now.forward_at:
        return []
    now.forward_at = None
    now.kill_at = t + grace_s if now.kill_at is None else min(now.kill_at, t + grace_s)
    why = "--sigterm-grace passed and the job still runs: forwarding SIGTERM to mpirun"
    return [Action(Do.FORWARD, why, signal.SIGTERM)]


def _notify(why: str) -> Action:
    return Action(Do.NOTIFY, f"{why}: telling the instances to save now", NOTICE_SIGNAL)


def _time_limit_actions(policy: EndingPolicy, t: float) -> list[Action]:
    """The save-now notice (again) and the end before the Slurm job's
    (:mod:`poprun.run.time_limit`); that end goes as at the time-out."""
    now = policy.now
    notice, stop = policy.time_limit.due(t, now.deadline)
    actions = [_notify(notice)] if notice else []
    if stop:
        now.deadline = None
        now.kill_at = policy._sooner(now.kill_at, t + policy.grace_s)
        actions.append(Action(Do.TIME_OUT, stop))
    return actions


def _lost_actions(policy: EndingPolicy, t: float) -> list[Action]:
    """A host lost while the job runs: name it, end the job as at the time-out (its
    instances wait for the lost ones in a collective: there is nothing to wait for)."""
    membership = policy.membership
    losses = membership.take_losses() if membership is not None else []
    if membership is not None and not losses and not policy.now.lost:
        back = membership.returning()
        if back and not policy.now.readmitting and policy.now.moved:  # --readmit: stop at
            # the next checkpoint (once the instances run: a notice before is ignored)
            policy.now.readmitting = True
            return [_notify(f"{', '.join(back)} answers again: readmitting it")]
    if not losses or policy.now.lost:
        return []
    now = policy.now
    now.lost = True
    now.instances_killed = True  # past the grace: mpirun and the instances, at once
    # mpirun already ending the job (an instance killed, a daemon gone): no SIGTERM (it
    # would only print "abort is already in progress", and it can crash in its finalize)
    aborting = now.exited_at_abort is not None
    now.kill_at = policy._sooner(now.kill_at, t + (0.0 if aborting else LOST_GRACE_S))
    named = "; ".join(f"{loss.host}: {loss.why}" for loss in losses)
    why = f"lost host {named}: ending what is left of the job"
    return [Action(Do.HOST_LOST, why, signum=0 if aborting else signal.SIGTERM)]


def _after_loss(policy: EndingPolicy, membership: Membership) -> Ending:
    """After an attempt that lost hosts: launch again on the rest (a new attempt, not a
    restart: ``--max-restarts`` is not used up), or end with :data:`EXIT_HOSTS_LOST`."""
    membership.take_losses()
    following = membership.relaunch(readmitting=policy.now.readmitting)
    if not following.hosts:
        return Ending(EXIT_HOSTS_LOST, following.line)
    policy.now = _Attempt()
    return Ending(EXIT_HOSTS_LOST, "", restart=following.line, hosts=following.hosts)


def _hang_actions(policy: EndingPolicy, t: float) -> list[Action]:
    """The hang clock's note or verdict (:mod:`poprun.run.progress.hang`); a hung job ends
    as at the time-out."""
    due = policy.hang.due(t)
    if due is Hang.NOTE:
        return [Action(Do.NOTE, "no progress for a while: the note on who waits for whom")]
    if due is Hang.REPORT:
        return [Action(Do.HANG_REPORT, "no progress for --hang-timeout (--on-hang=report)")]
    if due is Hang.HUNG:
        now = policy.now
        now.hung = True
        now.kill_at = policy._sooner(now.kill_at, t + policy.grace_s)
        why = f"--hang-timeout={policy.hang.timeout:g} passed without progress: ending the job"
        return [Action(Do.HANG, why)]
    return []


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
