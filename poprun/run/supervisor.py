"""Run mpirun and carry out the ending policy's decisions: the only module with side effects.

Event-driven (one ``selectors`` loop over mpirun's two pipes, the local instances' FIFOs, a
pidfd for mpirun's exit and one per local instance, and a wake-up socket for signals): it
routes output (:mod:`poprun.run.output.router`) and tells the ending policy
(:mod:`poprun.run.ending`) each event: a signal, an instance's or mpirun's exit, a remote
instance's exit status, mpirun's abort announcement, the end of the streams, a Ctrl-Z. What to do next (forward a signal,
end the job at the time-out, SIGKILL after a grace period, stop reading, launch again) and
the exit code and report are the policy's decisions; the supervisor only carries them out.

Each attempt's mpirun is started by a :class:`~poprun.run.launch.Launch` (in its own session,
dying with poprun); for a job on this host alone the first one was started before this module
was imported, and the attempt takes it over.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from popdist import env as contract
from poprun import log
from poprun.config.run_config import RunConfig
from poprun.errors import EXIT_HOSTS_LOST, PoprunError
from poprun.plan.hosts import is_local
from poprun.plan.topology import Topology
from poprun.run.ending import Action, Do, Ending, EndingPolicy, Evidence
from poprun.run.launch import Launch
from poprun.run.output.fifos import DirectOutput
from poprun.run.output.router import JobOutput
from poprun.run.output.tags import TagDemux
from poprun.run.processes import JobProcesses
from poprun.run.progress.hang import HangWatch
from poprun.run.progress.watch import DIAGNOSES, ProgressWatch
from poprun.run.signals import SignalInbox
from poprun.run.status.view import ProgressView
from poprun.run.time_limit import plan as plan_time_limit
from poprun.run.time_limit import requeue, requeuing

if TYPE_CHECKING:
    import socket

    from poprun.run.membership.watch import HostWatch
    from poprun.run.ssh_check import SharedConnections
    from poprun.run.status.server import StatusServer


class Feed(Protocol):
    """Where the bytes read from one of the job's pipes go (a tag demultiplexer or a FIFO's)."""

    def feed(self, data: bytes) -> None: ...

    def close(self) -> None: ...


#: Plans the job on fewer hosts: (topology, mpirun argv) (:func:`poprun.cli`).
Replan = Callable[[tuple[str, ...]], tuple[Topology, list[str]]]


def supervise(
    config: RunConfig,
    topology: Topology,
    argv: Sequence[str],
    env: Mapping[str, str],
    inbox: SignalInbox,
    *,
    status: StatusServer | None = None,
    replan: Replan | None = None,
    shared: SharedConnections | None = None,
    launch: Launch | None = None,
) -> int:
    """Run the job, print the report the ending policy gives, return the exit code.

    ``env`` holds the job's progress secret (:func:`~poprun.run.launch.with_secret`).
    ``status``: the ``--status-port`` endpoint, pointed at each attempt's progress.
    ``shared``: the ssh check's masters; a lost host's is stopped when the job ends on it.
    ``launch``: the first attempt's start, made by the caller (a job on this host alone).

    With ``--max-restarts N``, the policy launches a job that failed (not one ended by a
    signal poprun received, nor by ``--timeout``) again, up to N times; the program resumes
    from its checkpoint (``popdist_torch.checkpoint.resume_checkpoint``). A job across hosts
    is watched host by host (:mod:`poprun.run.membership`); with ``--min-hosts``, one that
    lost hosts is launched again on the rest (``replan``).
    """
    policy = _policy(config, topology, env)
    env = dict(env)
    watch = _watch_hosts(config, topology, env, policy)
    if watch is not None:
        watch.connections = shared
    try:
        while True:
            attempt = Supervisor(config, topology, argv, _generation(env, policy), policy, inbox)
            attempt.launch, launch = launch, None
            _watch_attempt(attempt, watch)
            if status is not None:
                _show(status, attempt)
            evidence = attempt.run()
            if watch is not None and config.min_hosts is not None:
                _judge_hosts(policy, watch)
            if watch is not None:
                watch.stop_probes()  # none outlives its attempt
            ending = policy.ending(evidence)
            attempt.progress_view.print_report()  # the per-instance table, the straggler
            _report(ending, env)
            if not ending.restart:
                return ending.code
            if ending.hosts and replan is not None:
                try:
                    topology, argv = replan(ending.hosts)
                except PoprunError as error:  # the smaller job cannot be planned
                    sys.stderr.write(
                        f"poprun: cannot launch on {', '.join(ending.hosts)}: {error}\n"
                    )
                    return EXIT_HOSTS_LOST
    finally:
        if watch is not None:
            watch.close()


def _show(status: StatusServer, attempt: Supervisor) -> None:
    """The ``--status-port`` endpoint shows this attempt's progress from now on."""
    status.live.attach(
        attempt.board.snapshot,
        instances=len(attempt.topology.instances),
        started=time.monotonic(),
        notes=lambda: attempt.progress.notes,
    )


def _watch_attempt(attempt: Supervisor, watch: HostWatch | None) -> None:
    """A job across hosts: the attempt's instances and progress to the host watch; its
    probes are poprun's own processes. mpirun saying it lost a host's daemon is its abort
    (it ends the job, though not with the box poprun reads as one): the policy hears it, so
    every host is asked at once, and what ends after it is mpirun's doing."""
    attempt.watch = watch
    if watch is not None:
        watch.attach(attempt.topology.instances, attempt.board.take_reports)
        attempt.procs.own_pids = watch.probe_pids
        attempt.output.on_daemon_lost = attempt.policy.mpirun_aborting


def _policy(config: RunConfig, topology: Topology, env: Mapping[str, str]) -> EndingPolicy:
    remote = any(not is_local(host) for host in topology.hosts)
    limit = plan_time_limit(
        config.time_limit_margin, config.requeue_on_timeout, env, time.monotonic
    )
    if config.time_limit_margin is not None and limit.end_at is None and config.timeout is None:
        log.warning("the Slurm job has no end time: --time-limit-margin has nothing to count from")
    policy = EndingPolicy(
        time.monotonic,
        timeout=config.timeout,
        remote=remote,
        max_restarts=config.max_restarts,
        time_limit=limit,
        sigterm_grace=config.sigterm_grace,
    )
    policy.hang = HangWatch(config.hang_timeout, config.on_hang)
    return policy


def _report(ending: Ending, env: Mapping[str, str]) -> None:
    """The ending's report, the requeue, the restart line, on stderr."""
    if ending.report:
        sys.stderr.write(ending.report + "\n")
    if ending.requeue:  # the line first: Slurm may end poprun as it requeues the job
        sys.stderr.write(requeuing(env) + "\n")
        sys.stderr.flush()
        failed = requeue(env)
        if failed:
            sys.stderr.write(failed + "\n")
    if ending.restart:
        sys.stderr.write(ending.restart + "\n")
    sys.stderr.flush()


def _watch_hosts(
    config: RunConfig, topology: Topology, env: dict[str, str], policy: EndingPolicy
) -> HostWatch | None:
    """A job across hosts: its membership, the probes, the lease (``env`` gets its address).
    Where the engine starts the daemons itself (Slurm, Grid Engine, LSF's blaunch), only with
    ``--min-hosts``, its nodes probed the engine's way (a step of the Slurm job, the engine's
    agent)."""
    remote = [host for host in topology.hosts if not is_local(host)]
    allocation = topology.allocation
    by_engine = allocation is not None and not allocation.launcher.ssh
    if not remote or (by_engine and config.min_hosts is None):
        return None
    # Imported here, not with this module: a job on one host needs none of them, and their
    # imports (a thread pool, logging, hmac) would add ~15 ms to every launch.
    from poprun.run.membership.lease import LeaseServer, facing_address
    from poprun.run.membership.members import Membership
    from poprun.run.membership.watch import (
        HostWatch,
        agent_probe,
        probe_command,
        slurm_addresses,
    )

    launch = next((host for host in topology.hosts if is_local(host)), None)
    membership = Membership(
        topology.hosts,
        time.monotonic,
        launch_host=launch,
        min_hosts=config.min_hosts,
        readmit=config.readmit,
    )
    policy.membership = membership
    lease = None
    # The lease only with --min-hosts: exported to a job without it, a SIGKILLed poprun's
    # mpirun was seen to leave its local instances running (cause not found yet).
    address = facing_address(remote) if config.min_hosts is not None else None
    if address is None and allocation is not None and allocation.engine == "Slurm":
        # a node's name may not resolve here
        address = facing_address(slurm_addresses(remote, env))
    if address is not None:
        lease = LeaseServer(address, env[contract.PROGRESS])
        env[contract.LEASE] = lease.address
    elif config.min_hosts is not None:
        log.warning(f"no address of this host reaches {remote[0]}: the instances hold no lease")
    if allocation is not None and allocation.launcher.probe:
        return HostWatch(membership, agent_probe(allocation.launcher.probe, env), lease)
    return HostWatch(membership, probe_command(config.global_args(), env), lease)


def _generation(env: Mapping[str, str], policy: EndingPolicy) -> dict[str, str]:
    """mpirun's environment for this attempt: the membership's generation (``--min-hosts``)."""
    if policy.membership is None or contract.GENERATION not in env:
        return dict(env)
    return {**env, contract.GENERATION: str(policy.membership.generation)}


def _judge_hosts(policy: EndingPolicy, watch: HostWatch) -> None:
    """After an attempt that failed by itself (``--min-hosts``): every member not heard from
    or answering since the failure is asked now, so a host that does not answer explains
    the failure. Whose failure came first otherwise is the policy's to judge, from the whole
    attempt's evidence (:meth:`EndingPolicy.ending`)."""
    now = policy.now
    if now.signals or now.timed_out or now.lost or now.returncode in (0, None):
        return
    watch.probe_now(watch.membership.unasked())


def _send(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


class Supervisor:
    """One launch of mpirun, from start to the :class:`~poprun.run.ending.Evidence` it leaves."""

    def __init__(
        self,
        config: RunConfig,
        topology: Topology,
        argv: Sequence[str],
        env: Mapping[str, str],
        policy: EndingPolicy,
        inbox: SignalInbox,
    ) -> None:
        self.config = config
        self.topology = topology
        self.argv = list(argv)
        self.env = dict(env)
        self.policy = policy
        self.inbox = inbox
        self.progress = ProgressWatch(policy, topology.instances, self.env)
        self.board = self.progress.board  # what the instances report (poprun.run.progress)
        self.output = JobOutput(
            config,
            topology,
            on_pid=self._watch_pid,
            on_abort=policy.mpirun_aborting,
            on_exit=policy.exit_reported,
            append=policy.restarts > 0,
            board=self.board,
            secret=self.progress.secret,
            on_progress=self.progress.progressed,
        )
        self.procs = JobProcesses(topology, self.output.pids)
        self.direct: DirectOutput | None = None
        #: This attempt's start, when made before the attempt (its mpirun perhaps started).
        self.launch: Launch | None = None
        self._handled = 0  # signals of the inbox already given to the policy
        self._still_running: list[int] = []
        self._selector: selectors.BaseSelector | None = None
        self._pidfds: dict[int, int] = {}  # pidfd -> instance (local instances only)
        self._demux: dict[int, Feed] = {}
        self._wake: socket.socket | None = None
        self.progress_view = ProgressView(self.board.snapshot, len(topology.instances))
        self.watch: HostWatch | None = None  # a job across hosts (poprun.run.membership)

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> Evidence:
        """Start mpirun (unless a signal came first), supervise it to the end, return the evidence."""
        launch = self.launch or Launch(self.topology, self.inbox)
        self.launch = None
        try:
            self.direct = launch.direct
            self.direct.deliver_to(self.output.on_instance)
            self._wake = launch.wake_r
            self.procs.not_ours = launch.not_ours
            self.output.open_files()
            self._launch_and_watch(launch)
        finally:
            launch.close()
            self.output.close()
        return Evidence(
            instances=self.output.results(),
            mpirun_failure=self.output.messages.failure,
            still_running=tuple(self._still_running),
            left_behind=tuple(self.procs.left_behind),
            remote=tuple(
                p.index for p in self.topology.instances if p.index not in self.procs.local
            ),
            mpirun_pid=self.procs.mpirun_pid,
            diagnosis=self.progress.diagnosis,
            peers=tuple(self.output.messages.peers),
        )

    def _launch_and_watch(self, launch: Launch) -> None:
        """mpirun started (unless ``launch`` did) and watched to its end; not started at all
        after a signal."""
        if not launch.tried:
            self._take_signals(None)
            if not self.policy.may_launch():
                return
            launch.start(self.argv, self.env)
        if launch.proc is None:
            self.policy.launch_failed(launch.error or "mpirun did not start")
            return
        proc = launch.proc
        self.policy.launched(at=launch.started_at)
        log.info(f"Waiting for mpirun (PID {proc.pid})")
        self.procs.mpirun_pid = proc.pid
        launch.watched = True
        self._loop(proc)

    def _watch_pid(self, instance: int, pid: int) -> None:
        """A local instance's pidfd tells the loop when it ends, in order (not its status)."""
        if self._selector is None or instance not in self.procs.local:
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            self._instance_exited(instance)
            return
        self._pidfds[pidfd] = instance
        self._selector.register(pidfd, selectors.EVENT_READ)
        self.procs.adopt(instance, pid)

    def _instance_exited(self, instance: int) -> None:
        self.procs.ended(instance)
        self.policy.instance_exited(instance)

    def _loop(self, proc: subprocess.Popen[bytes]) -> None:
        """Wait for events, tell the policy, carry out what it decides, until it says stop."""
        assert proc.stdout is not None and proc.stderr is not None
        assert self.direct is not None and self._wake is not None
        self._demux = {
            pipe.fileno(): TagDemux(self.output.on_instance, self.output.on_untagged)
            for pipe in (proc.stdout, proc.stderr)
        }
        for pipe in (proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
        self._demux.update(self.direct.feeds)
        pidfd = os.pidfd_open(proc.pid)
        selector = self._selector = selectors.DefaultSelector()
        for fd in (*self._demux, pidfd, self._wake.fileno()):
            selector.register(fd, selectors.EVENT_READ)
        try:
            while self.policy.reading:
                self._take_signals(proc)
                self._take_job_control()
                self.progress_view.answer(self.inbox.summaries)  # SIGUSR1/SIGUSR2: the live table
                if self.watch is not None and proc.returncode is None:
                    self.watch.tick()  # what each host was heard from, its probes
                self._carry_out(proc, self.policy.due())
                if not self.policy.reading:
                    break
                if proc.returncode is None:
                    self.procs.watch_for_orphans()
                for key, _ in selector.select(_wait_s(self)):
                    if key.fd == pidfd:
                        selector.unregister(pidfd)
                        self._carry_out(proc, self.policy.mpirun_exited(proc.wait()))
                    else:
                        self._on_ready(key.fd)
                self._carry_out(proc, self.progress.found())  # a desync ends the job
                if not self._demux:
                    self._carry_out(proc, self.policy.streams_closed())
                sys.stdout.flush()
                sys.stderr.flush()
        finally:
            self._finish(proc, pidfd)

    def _take_signals(self, proc: subprocess.Popen[bytes] | None) -> None:
        """Hand the signals received since the last look to the policy."""
        received = self.inbox.received
        while self._handled < len(received):
            signum = received[self._handled]
            self._handled += 1
            actions = self.policy.signal_received(signum)
            if proc is not None:
                self._carry_out(proc, actions)
        notices = self.inbox.notices
        while notices:  # the time-limit notice (SIGUSR1 in a Slurm job)
            actions = self.policy.notice_received(notices.pop(0))
            if proc is not None:
                self._carry_out(proc, actions)

    def _take_job_control(self) -> None:
        while self.inbox.job_control:
            stopped_for = self.procs.job_control(self.inbox.job_control.pop(0))
            self.policy.stopped_for(stopped_for)  # --timeout counts running time only
            self.board.shift(stopped_for)

    def _finish(self, proc: subprocess.Popen[bytes], pidfd: int) -> None:
        """Close the output, reap what is left of the job, remove a killed mpirun's files."""
        assert proc.stdout is not None and proc.stderr is not None
        for parser in self._demux.values():
            parser.close()
        if self._selector is not None:
            self._selector.close()
        self._selector = None
        for fd in (*self._pidfds, pidfd):
            os.close(fd)
        self._pidfds.clear()
        proc.stdout.close()
        proc.stderr.close()
        self.procs.signal_instances(signal.SIGKILL)  # any instance that outlived mpirun
        if self.watch is not None:  # its probes are poprun's, not the job's leftovers
            self.watch.stop_probes(unless_failing=True)  # (their answers may be wanted next)
        self.procs.kill_left_behind(keep={proc.pid} if proc.poll() is None else set())
        if self.policy.now.mpirun_killed:
            self.procs.remove_session_files(self.env)

    def _on_ready(self, fd: int) -> None:
        """One ready descriptor: an instance's pidfd, the signal wake-up, or an output pipe."""
        assert self._selector is not None and self._wake is not None
        if fd in self._pidfds:
            self._instance_exited(self._pidfds.pop(fd))
            self._selector.unregister(fd)
            os.close(fd)
        elif fd == self._wake.fileno():
            with contextlib.suppress(BlockingIOError):
                self._wake.recv(64)
        else:
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                return
            if data:
                self._demux[fd].feed(data)
                return
            self._demux.pop(fd).close()
            self._selector.unregister(fd)
            if self.direct is not None:
                self.direct.close_fd(fd)

    # --- carrying out the policy's decisions --------------------------------------------------

    def _carry_out(self, proc: subprocess.Popen[bytes], actions: list[Action]) -> None:
        for action in actions:
            if action.do is not Do.STOP_READING:
                log.info(action.why)
            if action.do is Do.FORWARD:
                _send(proc.pid, action.signum)
                self.procs.signal_instances(signal.SIGTERM)
            elif action.do is Do.NOTIFY:
                _send(proc.pid, action.signum)  # mpirun forwards it to every instance
            elif action.do in DIAGNOSES and not self.progress.carry_out(action):
                pass  # a note, or --on-hang=report: printed, the job goes on
            elif action.do is Do.HOST_LOST:
                _lost(self, proc, action)
            elif action.do is Do.TIME_OUT or action.do in DIAGNOSES:  # ends as at --timeout
                self._still_running = self.procs.running()
                _send(proc.pid, signal.SIGTERM)
                self.procs.signal_instances(signal.SIGTERM)
            elif action.do is Do.KILL_INSTANCES:
                self.procs.remember_segments()
                self.procs.signal_instances(signal.SIGKILL)
                if action.groups:
                    self.procs.signal_groups(signal.SIGKILL)
            elif action.do is Do.KILL_MPIRUN:
                self.procs.remember_segments()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # mpirun's own session: ours alone
                self.procs.signal_instances(signal.SIGKILL)
            elif action.do is Do.DRAIN:
                self.procs.kill_left_behind(keep=set())  # they may hold the pipes open
                for fd in list(self.direct.feeds if self.direct else ()):  # a FIFO no instance
                    self._on_ready(fd)  # opened reads as closed: done
            else:
                log.debug(action.why)


def _lost(supervisor: Supervisor, proc: subprocess.Popen[bytes], action: Action) -> None:
    """The job ends on a lost host, as at the time-out (SIGTERM, unless mpirun is already
    ending it: ``action.signum``). Its ssh connections will not end by themselves, so none
    is waited for, and its ssh master, which holds mpirun's output open, is stopped now."""
    log.warning(action.why)
    supervisor.procs.host_lost = True
    if supervisor.watch is not None:
        supervisor.watch.drop_lost()
    supervisor._still_running = supervisor.procs.running()
    if action.signum:
        _send(proc.pid, action.signum)
        supervisor.procs.signal_instances(action.signum)


def _wait_s(supervisor: Supervisor) -> float | None:
    """Until the policy's next deadline (in steps), the orphan check's, or the host watch's."""
    waits = [supervisor.policy.wait_s()]
    orphans_at = supervisor.procs.orphans_at
    if orphans_at is not None:
        waits.append(max(0.0, orphans_at - time.monotonic()))
    if supervisor.watch is not None:
        waits.append(supervisor.watch.wait_s())
    return min((w for w in waits if w is not None), default=None)
