"""Run mpirun and supervise it: the only module with side effects.

Event-driven (one ``selectors`` loop over mpirun's two pipes, a pidfd for its exit and a
wake-up pipe for signals): routes output (:mod:`poprun.run.output.router`), forwards
SIGINT/SIGTERM/SIGHUP, enforces ``--timeout`` and ends the whole job on the first failure.
It only *records* what happened: :class:`Supervisor` returns a
:class:`~poprun.run.verdict.RunResult`, and :func:`poprun.run.verdict.decide` (pure) turns that into
the exit code and the root-cause report; :func:`supervise` does both.

mpirun runs in its own session (so Ctrl-C on one poprun never reaches another job) with
``PR_SET_PDEATHSIG=SIGTERM``: if poprun is SIGKILLed, the kernel terminates mpirun, which
takes its instances down with it.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from poprun import log
from poprun.config.run_config import RunConfig
from poprun.plan.hosts import is_local
from poprun.plan.topology import Topology
from poprun.run.output.fifos import DirectOutput, enlarge_pipe
from poprun.run.output.router import JobOutput
from poprun.run.output.tags import TagDemux
from poprun.run.processes import JobProcesses
from poprun.run.verdict import RunResult, decide

#: After the first failure, a signal or the time-out: how long mpirun gets to end the job
#: itself before poprun SIGKILLs every instance it knows on this host...
GRACE_S = 1.5
#: ... or, when some instances run on other hosts, this long: mpirun needs about 2 s to end
#: a multi-host job (its daemons there end their instances and report back over ssh), and
#: poprun cannot kill remote instances itself.
REMOTE_GRACE_S = 5.0
#: ... and how long mpirun then gets, once its instances are killed, before it is killed too.
MPIRUN_GRACE_S = 0.8
#: Once mpirun has exited: how long its pipes may stay open (held by a stray grandchild).
DRAIN_S = 1.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Job control: Ctrl-Z stops the instances with poprun, ``fg``/``bg`` continues them.
_JOB_CONTROL = (signal.SIGTSTP, signal.SIGCONT)
PR_SET_PDEATHSIG = 1


class Feed(Protocol):
    """Where the bytes read from one of the job's pipes go (a tag demultiplexer or a FIFO's)."""

    def feed(self, data: bytes) -> None: ...

    def close(self) -> None: ...


def supervise(
    config: RunConfig, topology: Topology, argv: Sequence[str], env: Mapping[str, str]
) -> int:
    """Run the job, print the report :func:`~poprun.run.verdict.decide` gives, return the code.

    With ``--max-restarts N``, a job that failed (not one ended by a signal poprun received,
    nor by ``--timeout``) is launched again, up to N times; the program resumes from its
    checkpoint (``popdist_torch.checkpoint.resume_checkpoint``).
    """
    attempt = 0
    while True:
        result = Supervisor(config, topology, argv, env, attempt=attempt).run()
        code, report = decide(result)
        if report:
            sys.stderr.write(report + "\n")
        if code == 0 or attempt >= config.max_restarts or result.signals or result.timed_out:
            sys.stderr.flush()
            return code
        attempt += 1
        sys.stderr.write(
            f"poprun: the job failed with exit code {code}: restarting the job "
            f"(restart {attempt} of {config.max_restarts})\n"
        )
        sys.stderr.flush()


@contextlib.contextmanager
def _signals_recorded(
    wake: socket.socket, signals: list[int], job_control: list[int]
) -> Iterator[None]:
    """Record forwarded and job-control signals in the lists; wake the loop through ``wake``.

    On the way out the job-control handlers are restored; SIGINT/SIGTERM/SIGHUP keep poprun's
    recording handler: one that arrives as poprun ends must not turn its exit code into
    death by that signal.
    """
    previous = {sig: signal.getsignal(sig) for sig in _JOB_CONTROL}
    old_wakeup = signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
    for sig in _FORWARDED:
        signal.signal(sig, lambda signum, frame: signals.append(signum))
    for sig in _JOB_CONTROL:
        signal.signal(sig, lambda signum, frame: job_control.append(signum))
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_mpirun(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """mpirun in its own session (Ctrl-C on one poprun never reaches another job)."""
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    for pipe in (proc.stdout, proc.stderr):
        assert pipe is not None
        enlarge_pipe(pipe.fileno())
    return proc


def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signum)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the parent already died
        os._exit(1)


class Supervisor:
    """One run of mpirun, from start to a :class:`~poprun.run.verdict.RunResult`."""

    def __init__(
        self,
        config: RunConfig,
        topology: Topology,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        attempt: int = 0,
    ) -> None:
        self.config = config
        self.topology = topology
        self.argv = list(argv)
        self.env = dict(env)
        self.output = JobOutput(
            config, topology, on_pid=self._watch_pid, on_abort=self._aborted, append=attempt > 0
        )
        self.procs = JobProcesses(topology, self.output.pids)
        self._signals: list[int] = []
        self._job_control: list[int] = []
        self._kill_at: float | None = None
        self._instances_killed = False
        self._escalated = False
        self._timed_out = False
        self._still_running: list[int] = []
        self._selector: selectors.BaseSelector | None = None
        self._pidfds: dict[int, int] = {}  # pidfd -> instance (local instances only)
        self._exited_at_abort: list[int] | None = None
        self._mpirun_killed = False
        self.direct: DirectOutput | None = None
        remote = any(not is_local(plan.host) for plan in topology.instances)
        self.grace_s = REMOTE_GRACE_S if remote else GRACE_S

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Start mpirun, supervise it to the end, return what happened."""
        self.output.open_files()
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        self.procs.start()
        started = time.monotonic()
        local = [p.index for p in self.topology.instances if is_local(p.host)]
        try:
            self.direct = DirectOutput(local, self.output.on_instance)
            with _signals_recorded(wake_w, self._signals, self._job_control):
                try:
                    proc = _start_mpirun(self.argv, {**self.env, **self.direct.env()})
                except OSError as error:
                    return self._result(None, launch_error=str(error))
                log.info(f"Waiting for mpirun (PID {proc.pid})")
                self.procs.mpirun_pid = proc.pid
                returncode = self._loop(proc, wake_r, started)
        finally:
            wake_r.close()
            wake_w.close()
            if self.direct is not None:
                self.direct.close()
            self.output.close()
        return self._result(returncode)

    def _result(self, returncode: int | None, launch_error: str | None = None) -> RunResult:
        return RunResult(
            instances=self.output.results(),
            returncode=returncode,
            launch_error=launch_error,
            signals=tuple(self._signals),
            timeout=self.config.timeout,
            timed_out=self._timed_out,
            still_running=tuple(self._still_running),
            mpirun_failure=self.output.messages.failure,
            exited_at_abort=None if self._exited_at_abort is None else tuple(self._exited_at_abort),
            escalated=self._escalated,
            remote=tuple(p.index for p in self.topology.instances if not is_local(p.host)),
            left_behind=tuple(self.procs.left_behind),
            mpirun_pid=self.procs.mpirun_pid,
            mpirun_killed_by_poprun=self._mpirun_killed,
        )

    def _watch_pid(self, instance: int, pid: int) -> None:
        """A local instance's pidfd tells the loop when it ends, in order (not its status)."""
        if self._selector is None or not is_local(self.topology.instances[instance].host):
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            self.procs.exited.append(instance)
            return
        self._pidfds[pidfd] = instance
        self._selector.register(pidfd, selectors.EVENT_READ)
        self.procs.adopt(instance, pid)

    def _aborted(self) -> None:
        """mpirun announced it is aborting the job: it gets :data:`GRACE_S` to finish
        (:data:`REMOTE_GRACE_S` with instances on other hosts)."""
        self._exited_at_abort = list(self.procs.exited)
        self._kill_at = time.monotonic() + self.grace_s

    def _loop(self, proc: subprocess.Popen[bytes], wake: socket.socket, started: float) -> int:
        assert proc.stdout is not None and proc.stderr is not None
        assert self.direct is not None
        demux: dict[int, Feed] = {
            pipe.fileno(): TagDemux(self.output.on_instance, self.output.on_untagged)
            for pipe in (proc.stdout, proc.stderr)
        }
        for pipe in (proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
        demux.update(self.direct.feeds)
        pidfd = os.pidfd_open(proc.pid)
        selector = self._selector = selectors.DefaultSelector()
        for fd in (*demux, pidfd, wake.fileno()):
            selector.register(fd, selectors.EVENT_READ)
        deadline = started + self.config.timeout if self.config.timeout else None
        returncode: int | None = None
        drain_until: float | None = None
        handled = 0
        try:
            while demux:
                waits = (deadline, self._kill_at, drain_until, self.procs.orphans_at)
                soonest = min((t for t in waits if t is not None), default=None)
                timeout = None if soonest is None else max(0.0, soonest - time.monotonic())
                for key, _ in selector.select(timeout):
                    if key.fd == pidfd:
                        returncode = proc.wait()
                        selector.unregister(pidfd)
                        drain_until = time.monotonic() + DRAIN_S
                        self.procs.kill_left_behind(keep=set())  # they may hold the pipes open
                        for fd in list(self.direct.feeds):  # a FIFO no instance opened
                            self._on_ready(fd, demux, wake)  # reads as closed: done
                    else:
                        self._on_ready(key.fd, demux, wake)
                sys.stdout.flush()
                sys.stderr.flush()
                while self._job_control:
                    stopped_for = self.procs.job_control(self._job_control.pop(0))
                    if deadline is not None:
                        deadline += stopped_for  # --timeout counts running time only
                for signum in self._signals[handled:]:
                    self._forward(proc, signum, first=handled == 0)
                    handled += 1
                if deadline is not None and time.monotonic() >= deadline and returncode is None:
                    self._time_out(proc)
                    deadline = None
                if returncode is None:
                    self._escalate(proc)
                    self.procs.watch_for_orphans()
                if drain_until is not None and time.monotonic() >= drain_until:
                    break  # mpirun is gone; a pipe kept open by a stray grandchild is not ours
            if returncode is None:
                returncode = proc.wait()
        finally:
            self._finish(proc, demux, pidfd)
        return returncode

    def _finish(self, proc: subprocess.Popen[bytes], demux: dict[int, Feed], pidfd: int) -> None:
        """Close the output, reap what is left of the job, remove a killed mpirun's files."""
        assert proc.stdout is not None and proc.stderr is not None
        for parser in demux.values():
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
        self.procs.kill_left_behind(keep={proc.pid} if proc.poll() is None else set())
        if self._mpirun_killed:
            self.procs.remove_session_files(self.env)

    def _on_ready(self, fd: int, demux: dict[int, Feed], wake: socket.socket) -> None:
        """One ready descriptor: an instance's pidfd, the signal wake-up, or an output pipe."""
        assert self._selector is not None
        if fd in self._pidfds:
            self.procs.exited.append(self._pidfds.pop(fd))
            self._selector.unregister(fd)
            os.close(fd)
        elif fd == wake.fileno():
            with contextlib.suppress(BlockingIOError):
                wake.recv(64)
        else:
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                return
            if data:
                demux[fd].feed(data)
                return
            demux.pop(fd).close()
            self._selector.unregister(fd)
            if self.direct is not None:
                self.direct.close_fd(fd)

    # --- ending the job -----------------------------------------------------------------------

    def _forward(self, proc: subprocess.Popen[bytes], signum: int, *, first: bool) -> None:
        name = signal.Signals(signum).name
        if first:
            log.info(f"received {name}: forwarding it to mpirun (PID {proc.pid})")
            _send(proc, signum)
            self.procs.signal_instances(signal.SIGTERM)
            self._kill_at = time.monotonic() + self.grace_s
        else:
            # The instances go at once; mpirun gets MPIRUN_GRACE_S to see them end and remove
            # its session files before it is killed too (see _escalate).
            log.info(f"received {name} again: killing the instances now")
            self._kill_instances()
            self.procs.signal_groups(signal.SIGKILL)
            self._kill_at = time.monotonic() + MPIRUN_GRACE_S

    def _time_out(self, proc: subprocess.Popen[bytes]) -> None:
        self._timed_out = True
        self._still_running = self.procs.running()
        log.info(f"--timeout={self.config.timeout:g} expired: ending the job")
        _send(proc, signal.SIGTERM)
        self.procs.signal_instances(signal.SIGTERM)
        self._kill_at = time.monotonic() + self.grace_s

    def _escalate(self, proc: subprocess.Popen[bytes]) -> None:
        """Past the grace period: SIGKILL the local instances, and later mpirun too."""
        now = time.monotonic()
        if self._kill_at is None or now < self._kill_at:
            return
        self._escalated = True
        if self._instances_killed:
            log.info("the job did not end in time: sending SIGKILL to mpirun and its instances")
            self.procs.remember_segments()
            self._mpirun_killed = True  # its session files are poprun's to remove
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # mpirun's own session: ours alone
            self.procs.signal_instances(signal.SIGKILL)
            self._kill_at = None
            return
        # First the instances, by pid: mpirun then sees them end, reports the first
        # failure's status and exits by itself, in well under a second.
        log.info("the job did not end in time: sending SIGKILL to the instances")
        self._kill_instances()
        self._kill_at = now + MPIRUN_GRACE_S

    def _kill_instances(self) -> None:
        self.procs.remember_segments()
        self.procs.signal_instances(signal.SIGKILL)
        self._instances_killed = True
