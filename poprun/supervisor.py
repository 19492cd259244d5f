"""Run mpirun and supervise it: the only module with side effects.

Event-driven (one ``selectors`` loop over mpirun's two pipes, a pidfd for its exit and a
wake-up pipe for signals): routes output (:mod:`poprun.job_output`), forwards
SIGINT/SIGTERM/SIGHUP, enforces ``--timeout`` and ends the whole job on the first failure.
It only *records* what happened: :class:`Supervisor` returns a
:class:`~poprun.outcome.RunResult`, and :func:`poprun.outcome.decide` (pure) turns that into
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
from collections.abc import Mapping, Sequence

from poprun import log
from poprun.config import RunConfig
from poprun.hosts import is_local
from poprun.job_output import JobOutput
from poprun.outcome import RunResult, decide
from poprun.output import TagDemux
from poprun.topology import Topology

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
PR_SET_PDEATHSIG = 1


def supervise(
    config: RunConfig, topology: Topology, argv: Sequence[str], env: Mapping[str, str]
) -> int:
    """Run the job, print the report :func:`~poprun.outcome.decide` gives, return the code."""
    code, report = decide(Supervisor(config, topology, argv, env).run())
    if report:
        sys.stderr.write(report + "\n")
        sys.stderr.flush()
    return code


def _die_with_parent() -> None:  # runs in the child between fork and exec
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the parent already died
        os._exit(1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class Supervisor:
    """One run of mpirun, from start to a :class:`~poprun.outcome.RunResult`."""

    def __init__(
        self,
        config: RunConfig,
        topology: Topology,
        argv: Sequence[str],
        env: Mapping[str, str],
    ) -> None:
        self.config = config
        self.topology = topology
        self.argv = list(argv)
        self.env = dict(env)
        self.output = JobOutput(config, topology, on_pid=self._watch_pid, on_abort=self._aborted)
        self.exited: list[int] = []  # local instances in the order they ended
        self._signals: list[int] = []
        self._kill_at: float | None = None
        self._instances_killed = False
        self._escalated = False
        self._timed_out = False
        self._still_running: list[int] = []
        self._selector: selectors.BaseSelector | None = None
        self._pidfds: dict[int, int] = {}  # pidfd -> instance (local instances only)
        self._exited_at_abort: list[int] | None = None
        remote = any(not is_local(plan.host) for plan in topology.instances)
        self.grace_s = REMOTE_GRACE_S if remote else GRACE_S

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> RunResult:
        """Start mpirun, supervise it to the end, return what happened."""
        self.output.open_files()
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        previous = {sig: signal.getsignal(sig) for sig in _FORWARDED}
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        for sig in _FORWARDED:
            signal.signal(sig, self._record_signal)
        started = time.monotonic()
        try:
            try:
                proc = subprocess.Popen(
                    self.argv,
                    env=self.env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as error:
                return self._result(None, launch_error=str(error))
            log.info(f"Waiting for mpirun (PID {proc.pid})")
            returncode = self._loop(proc, wake_r, started)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            wake_r.close()
            wake_w.close()
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
        )

    def _record_signal(self, signum: int, frame: object) -> None:
        self._signals.append(signum)

    def _watch_pid(self, instance: int, pid: int) -> None:
        """A local instance's pidfd tells the loop when it ends, in order (not its status)."""
        if self._selector is None or not is_local(self.topology.instances[instance].host):
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            self.exited.append(instance)
            return
        self._pidfds[pidfd] = instance
        self._selector.register(pidfd, selectors.EVENT_READ)

    def _aborted(self) -> None:
        """mpirun announced it is aborting the job: it gets :data:`GRACE_S` to finish
        (:data:`REMOTE_GRACE_S` with instances on other hosts)."""
        self._exited_at_abort = list(self.exited)
        self._kill_at = time.monotonic() + self.grace_s

    def _loop(self, proc: subprocess.Popen[bytes], wake: socket.socket, started: float) -> int:
        assert proc.stdout is not None and proc.stderr is not None
        demux = {
            pipe.fileno(): TagDemux(self.output.on_instance, self.output.on_untagged)
            for pipe in (proc.stdout, proc.stderr)
        }
        pidfd = os.pidfd_open(proc.pid)
        selector = self._selector = selectors.DefaultSelector()
        for fd in (*demux, pidfd, wake.fileno()):
            if fd in demux:
                os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        deadline = started + self.config.timeout if self.config.timeout else None
        returncode: int | None = None
        drain_until: float | None = None
        handled = 0
        try:
            while demux:
                waits = [t for t in (deadline, self._kill_at, drain_until) if t is not None]
                timeout = max(0.0, min(waits) - time.monotonic()) if waits else None
                for key, _ in selector.select(timeout):
                    if key.fd == pidfd:
                        returncode = proc.wait()
                        selector.unregister(pidfd)
                        drain_until = time.monotonic() + DRAIN_S
                    else:
                        self._on_ready(key.fd, demux, wake)
                sys.stdout.flush()
                sys.stderr.flush()
                for signum in self._signals[handled:]:
                    self._forward(proc, signum, first=handled == 0)
                    handled += 1
                if deadline is not None and time.monotonic() >= deadline and returncode is None:
                    self._time_out(proc)
                    deadline = None
                if returncode is None:
                    self._escalate(proc)
                if drain_until is not None and time.monotonic() >= drain_until:
                    break  # mpirun is gone; a pipe kept open by a stray grandchild is not ours
            if returncode is None:
                returncode = proc.wait()
        finally:
            for parser in demux.values():
                parser.close()
            self._close_selector(pidfd)
            proc.stdout.close()
            proc.stderr.close()
            self._reap_local_instances()
        return returncode

    def _on_ready(self, fd: int, demux: dict[int, TagDemux], wake: socket.socket) -> None:
        """One ready descriptor: an instance's pidfd, the signal wake-up, or an output pipe."""
        assert self._selector is not None
        if fd in self._pidfds:
            self.exited.append(self._pidfds.pop(fd))
            self._selector.unregister(fd)
            os.close(fd)
        elif fd == wake.fileno():
            with contextlib.suppress(BlockingIOError):
                wake.recv(64)
        else:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            if data:
                demux[fd].feed(data)
            else:
                demux.pop(fd).close()
                self._selector.unregister(fd)

    def _close_selector(self, pidfd: int) -> None:
        if self._selector is not None:
            self._selector.close()
        self._selector = None
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds.clear()
        os.close(pidfd)

    # --- ending the job -----------------------------------------------------------------------

    def _forward(self, proc: subprocess.Popen[bytes], signum: int, *, first: bool) -> None:
        name = signal.Signals(signum).name
        if first:
            log.info(f"received {name}: forwarding it to mpirun (PID {proc.pid})")
            self._send(proc, signum)
            self._signal_local_instances(signal.SIGTERM)
            self._kill_at = time.monotonic() + self.grace_s
        else:
            log.info(f"received {name} again: killing the job now")
            self._kill_everything(proc)

    def _time_out(self, proc: subprocess.Popen[bytes]) -> None:
        self._timed_out = True
        self._still_running = self._running_instances()
        log.info(f"--timeout={self.config.timeout:g} expired: ending the job")
        self._send(proc, signal.SIGTERM)
        self._signal_local_instances(signal.SIGTERM)
        self._kill_at = time.monotonic() + self.grace_s

    def _escalate(self, proc: subprocess.Popen[bytes]) -> None:
        """Past the grace period: SIGKILL the local instances, and later mpirun too."""
        now = time.monotonic()
        if self._kill_at is None or now < self._kill_at:
            return
        self._escalated = True
        if self._instances_killed:
            self._kill_everything(proc)
            self._kill_at = None
            return
        # First the instances, by pid: mpirun then sees them end, reports the first
        # failure's status and exits by itself, in well under a second.
        log.info("the job did not end in time: sending SIGKILL to the instances")
        self._signal_local_instances(signal.SIGKILL)
        self._instances_killed = True
        self._kill_at = now + MPIRUN_GRACE_S

    def _running_instances(self) -> list[int]:
        """Instances not known to have ended (remote ones and those without a pid count)."""
        running = []
        for plan in self.topology.instances:
            pid = self.output.pids.get(plan.index)
            if plan.index in self.exited:
                continue
            if pid is None or not is_local(plan.host) or _alive(pid):
                running.append(plan.index)
        return running

    @staticmethod
    def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signum)

    def _kill_everything(self, proc: subprocess.Popen[bytes]) -> None:
        log.info("the job did not end in time: sending SIGKILL to mpirun and its instances")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # mpirun's own session: ours alone
        self._reap_local_instances()

    def _signal_local_instances(self, signum: int) -> None:
        """Signal, by pid, every live instance on this host (mpirun then ends the job at once)."""
        for plan in self.topology.instances:
            pid = self.output.pids.get(plan.index)
            mine = pid is not None and plan.index not in self.exited and is_local(plan.host)
            if mine and pid is not None and _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def _reap_local_instances(self) -> None:
        """SIGKILL, by pid, any instance on this host that outlived mpirun."""
        self._signal_local_instances(signal.SIGKILL)
