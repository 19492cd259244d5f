"""Run mpirun and supervise it: the only module with side effects.

Event-driven (one ``selectors`` loop over mpirun's two pipes, a pidfd for its exit and a
wake-up pipe for signals): prefixes and filters output, forwards SIGINT/SIGTERM/SIGHUP,
enforces ``--timeout``, ends the whole job on the first failure and reports its root cause.

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
from typing import BinaryIO

from poprun import log
from poprun.config import RunConfig
from poprun.errors import EXIT_LAUNCH_FAILED, EXIT_TIMEOUT
from poprun.hosts import is_local
from poprun.output import InstanceStream, TagDemux, open_output_file
from poprun.report import Failure, MpirunMessages, failure_report
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
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1


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
    """One run of mpirun, from start to exit code."""

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
        self.pids: dict[int, int] = {}
        self.messages = MpirunMessages()
        self.streams: dict[tuple[int, str], InstanceStream] = {}
        self._files: list[BinaryIO] = []
        self._signals: list[int] = []
        self._kill_at: float | None = None
        self._instances_killed = False
        self._timed_out = False
        self._still_running: list[int] = []
        self._selector: selectors.BaseSelector | None = None
        self._pidfds: dict[int, int] = {}  # pidfd -> instance (local instances only)
        self.exited: list[int] = []  # local instances in the order they ended
        self._exited_at_abort: list[int] | None = None
        remote = any(not is_local(plan.host) for plan in topology.instances)
        self.grace_s = REMOTE_GRACE_S if remote else GRACE_S

    # --- set-up -------------------------------------------------------------------------------

    def _stream(self, instance: int, kind: str) -> InstanceStream:
        key = (instance, kind)
        stream = self.streams.get(key)
        if stream is None:
            only = self.config.only_output_from_instance
            shown = only is None or only == instance
            console = (
                (sys.stdout.buffer if kind == "stdout" else sys.stderr.buffer) if shown else None
            )
            file = None
            if self.config.output_dir is not None:
                file = open_output_file(self.config.output_dir, instance, kind)
                self._files.append(file)
            stream = InstanceStream(
                instance,
                kind,
                console,
                file,
                on_pid=self._on_pid if kind == "stderr" else None,
            )
            self.streams[key] = stream
        return stream

    def _on_pid(self, instance: int, pid: int) -> None:
        self.pids[instance] = pid
        log.debug(f"instance {instance} has pid {pid}")
        if self._selector is not None and is_local(self.topology.instances[instance].host):
            try:  # a pidfd tells us when the instance ends, in order (not its status)
                pidfd = os.pidfd_open(pid)
            except OSError:
                self.exited.append(instance)
                return
            self._pidfds[pidfd] = instance
            self._selector.register(pidfd, selectors.EVENT_READ)

    def _on_instance(self, instance: int, kind: str, data: bytes) -> None:
        self._stream(instance, kind).feed(data)

    def _on_untagged(self, data: bytes) -> None:
        for line in self.messages.feed_line(data.decode("utf-8", "replace")):
            sys.stderr.write(line + "\n")
        log.debug(f"mpirun: {data.decode('utf-8', 'replace').rstrip()}")
        if self.messages.aborting and self._exited_at_abort is None:
            self._exited_at_abort = list(self.exited)
            self._kill_at = time.monotonic() + self.grace_s

    # --- the run ------------------------------------------------------------------------------

    def run(self) -> int:
        """Start mpirun, supervise it to the end, return poprun's exit code."""
        if self.config.output_dir is not None:
            os.makedirs(self.config.output_dir, mode=0o755, exist_ok=True)
            for plan in self.topology.instances:  # every instance gets its files, even if silent
                self._stream(plan.index, "stdout")
                self._stream(plan.index, "stderr")
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
                sys.stderr.write(f"poprun: cannot start mpirun: {error}\n")
                return EXIT_LAUNCH_FAILED
            log.info(f"Waiting for mpirun (PID {proc.pid})")
            returncode = self._loop(proc, wake_r, started)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            wake_r.close()
            wake_w.close()
            for stream in self.streams.values():
                stream.close()
            sys.stdout.flush()
            sys.stderr.flush()
            for handle in self._files:
                handle.close()
        return self._exit_code(returncode)

    def _record_signal(self, signum: int, frame: object) -> None:
        self._signals.append(signum)

    def _loop(self, proc: subprocess.Popen[bytes], wake: socket.socket, started: float) -> int:
        assert proc.stdout is not None and proc.stderr is not None
        demux = {
            proc.stdout.fileno(): TagDemux(self._on_instance, self._on_untagged),
            proc.stderr.fileno(): TagDemux(self._on_instance, self._on_untagged),
        }
        pidfd = os.pidfd_open(proc.pid)
        selector = selectors.DefaultSelector()
        self._selector = selector
        for fd in demux:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        selector.register(pidfd, selectors.EVENT_READ)
        selector.register(wake, selectors.EVENT_READ)
        deadline = started + self.config.timeout if self.config.timeout else None
        handled_signals = 0
        returncode: int | None = None
        drain_until: float | None = None
        try:
            while demux:
                now = time.monotonic()
                waits = [t for t in (deadline, self._kill_at, drain_until) if t is not None]
                timeout = max(0.0, min(waits) - now) if waits else None
                for key, _ in selector.select(timeout):
                    fd = key.fd
                    if fd in self._pidfds:
                        self.exited.append(self._pidfds.pop(fd))
                        selector.unregister(fd)
                        os.close(fd)
                    elif fd == pidfd:
                        returncode = proc.wait()
                        selector.unregister(pidfd)
                        drain_until = time.monotonic() + 1.0
                    elif fd == wake.fileno():
                        with contextlib.suppress(BlockingIOError):
                            wake.recv(64)
                    else:
                        try:
                            data = os.read(fd, 65536)
                        except BlockingIOError:
                            continue
                        if data:
                            demux[fd].feed(data)
                        else:
                            demux.pop(fd).close()
                            selector.unregister(fd)
                for stream in ((sys.stdout), (sys.stderr)):
                    stream.flush()
                while handled_signals < len(self._signals):
                    self._forward(proc, self._signals[handled_signals], first=handled_signals == 0)
                    handled_signals += 1
                now = time.monotonic()
                if deadline is not None and now >= deadline and returncode is None:
                    self._time_out(proc)
                    deadline = None
                if self._kill_at is not None and now >= self._kill_at and returncode is None:
                    if self._instances_killed:
                        self._kill_everything(proc)
                        self._kill_at = None
                    else:
                        # First the instances, by pid: mpirun then sees them end, reports the
                        # first failure's status and exits by itself, in well under a second.
                        log.info("the job did not end in time: sending SIGKILL to the instances")
                        self._signal_local_instances(signal.SIGKILL)
                        self._instances_killed = True
                        self._kill_at = now + MPIRUN_GRACE_S
                if drain_until is not None and now >= drain_until:
                    break  # mpirun is gone; a pipe kept open by a stray grandchild is not ours
            if returncode is None:
                returncode = proc.wait()
        finally:
            for fd, parser in demux.items():
                parser.close()
                del fd
            selector.close()
            self._selector = None
            for fd in self._pidfds:
                os.close(fd)
            self._pidfds.clear()
            os.close(pidfd)
            proc.stdout.close()
            proc.stderr.close()
            for line in self.messages.finish():
                sys.stderr.write(line + "\n")
            self._reap_local_instances()
        return returncode

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

    def _running_instances(self) -> list[int]:
        running = []
        for plan in self.topology.instances:
            pid = self.pids.get(plan.index)
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
            pid = self.pids.get(plan.index)
            mine = pid is not None and plan.index not in self.exited and is_local(plan.host)
            if mine and pid is not None and _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def _reap_local_instances(self) -> None:
        """SIGKILL, by pid, any instance on this host that outlived mpirun."""
        self._signal_local_instances(signal.SIGKILL)

    def _exit_code(self, returncode: int) -> int:
        if self._signals:
            code = 128 + self._signals[0]
            sys.stderr.write(
                f"poprun: received {signal.Signals(self._signals[0]).name}; ended the job; "
                f"exit code {code}\n"
            )
            return code
        if self._timed_out:
            running = ", ".join(
                f"{i} (host {self.topology.instances[i].host}, pid {self.pids.get(i, 'unknown')})"
                for i in self._still_running
            )
            sys.stderr.write(
                f"poprun: --timeout={self.config.timeout:g} s expired; "
                f"instances still running: {running or 'none'}\n"
                f"poprun: ended the job; exit code {EXIT_TIMEOUT}\n"
            )
            return EXIT_TIMEOUT
        failure = self.messages.failure
        if failure is None and self._exited_at_abort:
            # mpirun aborted without naming the process (it sometimes omits that note):
            # the instance that ended last before the abort is the one that failed, and
            # mpirun's own status is the first failure's.
            last = self._exited_at_abort[-1]
            if returncode > 128:
                failure = Failure(last, signal=returncode - 128)
            elif returncode > 0:
                failure = Failure(last, exit_code=returncode)
            else:  # mpirun itself was ended before it said: the status is not known
                failure = Failure(last, status_known=False)
        if failure is not None:
            # A Python exception in one instance often makes the *others* exit first (Horovod
            # shuts them down): the earliest traceback is the root cause.
            raised = sorted(
                (s.traceback_at, i)
                for (i, kind), s in self.streams.items()
                if kind == "stderr" and s.traceback_at is not None
            )
            if raised and raised[0][1] != failure.instance:
                log.info(
                    f"mpirun saw instance {failure.instance} end first, but instance "
                    f"{raised[0][1]} raised first: reporting instance {raised[0][1]}"
                )
                failure = Failure(raised[0][1], failure.exit_code, failure.signal)
        if failure is not None and 0 <= failure.instance < len(self.topology.instances):
            code = failure.poprun_exit_code
            if failure.exit_code is None and failure.signal is None:
                code = returncode if returncode > 0 else 1
            stream = self.streams.get((failure.instance, "stderr"))
            sys.stderr.write(
                failure_report(
                    failure,
                    host=self.topology.instances[failure.instance].host,
                    pid=self.pids.get(failure.instance),
                    tail=stream.tail_text() if stream is not None else [],
                    exit_code=code,
                )
                + "\n"
            )
            return code
        if returncode < 0:
            return 128 - returncode
        if returncode:
            log.info(f"mpirun exited with {returncode}")
        return returncode
