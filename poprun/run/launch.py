"""One start of mpirun: what must be in place before it, and mpirun itself.

Before mpirun starts, poprun becomes the job's child subreaper and notes its own children,
makes the FIFOs of this host's instances (:mod:`poprun.run.output.fifos`), the signal
wake-up, and takes job control for the run. Then mpirun starts in its own session (so Ctrl-C
on one poprun never reaches another job) with ``PR_SET_PDEATHSIG=SIGTERM``: if poprun is
SIGKILLed, the kernel terminates mpirun, which takes its instances down with it.

This module is light on purpose: it imports none of the supervision (the ending policy, the
output routing, the progress board). For a job on this host alone, poprun starts the first
attempt's mpirun through it and only then loads the supervisor
(:class:`~poprun.run.supervisor.Supervisor`), which takes the started :class:`Launch` over;
the supervisor's imports (about 30 ms) then run while mpirun starts the instances, not
before it. Every later attempt is started the same way, by the supervisor.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from popdist.env import PROGRESS
from poprun.errors import PoprunError
from poprun.plan.hosts import is_local
from poprun.run import leftovers
from poprun.run.output.fifos import DirectOutput, enlarge_pipe

if TYPE_CHECKING:
    from poprun.config.run_config import RunConfig
    from poprun.plan.topology import Topology
    from poprun.run.signals import SignalInbox

PR_SET_PDEATHSIG = 1
#: How long an mpirun that no loop watched gets to end its instances after SIGTERM.
_END_S = 5.0
#: Descriptors poprun and mpirun hold whatever the job's size (standard streams, pipes, the
#: selector, the signal wake-up, Open MPI's own), with room to spare: 9 and 34 measured.
BASE_FDS = 64
#: ... poprun's for each instance on this host (its two FIFOs and its pidfd), each instance's
#: ``--output-dir`` files and lease connection, and mpirun's for each host (its daemon's
#: connection back, the ssh that started it): measured with 16 to 128 instances.
PER_LOCAL_FDS, PER_FILE_FDS, PER_HOST_FDS = 3, 2, 2


def descriptors_needed(config: RunConfig, topology: Topology) -> int:
    """File descriptors the job needs in poprun, or in mpirun (which inherits poprun's limit),
    whichever is more."""
    instances = len(topology.instances)
    local = {host: is_local(host) for host in topology.hosts}
    here = sum(1 for plan in topology.instances if local.get(plan.host, False))
    poprun = BASE_FDS + PER_LOCAL_FDS * here
    if config.output_dir is not None:
        poprun += PER_FILE_FDS * instances
    if config.min_hosts is not None and not all(local.values()):
        poprun += instances  # the lease: a connection from every instance
    return max(poprun, BASE_FDS + PER_HOST_FDS * len(topology.hosts))


def raise_file_limit(needed: int) -> None:
    """A soft ``RLIMIT_NOFILE`` below ``needed`` goes up to four times ``needed`` or 65,536
    (room for mpirun's own and what the count leaves out), at most the hard limit: mpirun
    and the instances inherit it, and
    a container's hard limit (2^20 and more) would make programs that close or scan every
    descriptor up to the limit slow. A hard limit below ``needed`` is a usage error, before
    any launch."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise PoprunError(
            "RLIMIT_NOFILE",
            hard,
            f"the job needs about {needed} open files on this host (its instances' output "
            f"and exits, mpirun's connections) but the hard limit (ulimit -Hn) is {hard}",
            f"raise the hard limit by {needed - hard} or more (ulimit -Hn {needed}, as root, "
            f"or nofile in /etc/security/limits.conf), or run fewer instances on this host",
        )
    wanted = max(4 * needed, 65536)
    wanted = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):  # an unlimited hard limit: the kernel's may be lower
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def with_secret(env: Mapping[str, str]) -> dict[str, str]:
    """mpirun's environment with a fresh secret for the job's progress records."""
    # os.urandom is what secrets.token_hex reads; importing secrets (hmac, hashlib,
    # random, base64) would cost every launch a few milliseconds.
    return {**env, PROGRESS: os.urandom(16).hex()}


class Launch:
    """One attempt's start. Made before mpirun starts; :meth:`close` when the attempt ends."""

    def __init__(self, topology: Topology, inbox: SignalInbox) -> None:
        self.inbox = inbox
        self.proc: subprocess.Popen[bytes] | None = None
        #: Why mpirun could not be started (``None``: started, or not tried).
        self.error: str | None = None
        self.started_at: float | None = None  # time.monotonic() at the start
        #: The supervisor's loop watches mpirun (until then, an error kills it: :meth:`close`).
        self.watched = False
        self._closed = False
        # From here a signal is the policy's to judge (it is recorded, not raised): this
        # attempt either starts, or sees the signal and launches nothing.
        inbox.interrupting = False
        self.wake_r, self.wake_w = _wake_pair()
        leftovers.become_subreaper()  # orphans of the job re-parent to poprun, not to init
        self.not_ours = set(leftovers.children(os.getpid()))  # a caller's own children
        local = [plan.index for plan in topology.instances if is_local(plan.host)]
        try:
            self.direct = DirectOutput(local)
            inbox.watch_job_control(self.wake_w.fileno())
        except BaseException:
            self.wake_r.close()
            self.wake_w.close()
            raise

    @property
    def tried(self) -> bool:
        """mpirun was started, or failed to start."""
        return self.proc is not None or self.error is not None

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        """Start mpirun; an OSError (no such program, no memory) is kept in :attr:`error`."""
        try:
            self.proc = _start_mpirun(argv, {**env, **self.direct.env()})
        except OSError as error:
            self.error = str(error)
        self.started_at = time.monotonic()

    def close(self) -> None:
        """Job control and the wake-up as they were; the FIFOs removed. An mpirun that no
        loop ever watched (an error on the way) is ended (SIGTERM, then its session SIGKILLed)
        and reaped."""
        if self._closed:
            return
        self._closed = True
        proc = self.proc
        if proc is not None and not self.watched and proc.poll() is None:
            proc.terminate()  # mpirun ends its instances
            try:
                proc.wait(timeout=_END_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # mpirun's own session: ours alone
                proc.wait()
        self.inbox.unwatch_job_control()
        self.wake_r.close()
        self.wake_w.close()
        self.direct.close()


def _start_mpirun(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=functools.partial(_die_with_parent, os.getpid()),
    )
    for pipe in (proc.stdout, proc.stderr):
        assert pipe is not None
        enlarge_pipe(pipe.fileno())
    return proc


def _wake_pair() -> tuple[socket.socket, socket.socket]:
    """The signal wake-up: a non-blocking socket pair (read end, write end)."""
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    return wake_r, wake_w


def _die_with_parent(parent: int) -> None:  # runs in the child between fork and exec
    """SIGTERM when poprun (``parent``) dies; gone already: exit. Compared with poprun's own
    pid, not with 1: poprun may be PID 1 itself (a container's command)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent already died
        os._exit(1)
