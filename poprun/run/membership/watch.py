"""The supervisor's side of membership: what was heard from each host, and the probes.

One :class:`HostWatch` per job across hosts. Each turn of the supervisor's loop
(:meth:`HostWatch.tick`) it tells the :class:`~poprun.run.membership.members.Membership` when
each host was last heard from (the newest progress record of any instance there, from the
progress board, and the newest lease heartbeat, :mod:`poprun.run.membership.lease`), takes
the probes that finished, and starts the ones the membership asks for, each on a thread of
its own so the loop never waits for ssh.

A probe is the launch agent mpirun uses (``ssh`` unless ``plm_rsh_agent`` says otherwise,
:func:`poprun.run.ssh_check.agent`), with a new connection (never a shared master, whose
connection may be the one that is dead) and a short time-out: ``AGENT -o ControlPath=none
-o ConnectTimeout=3 HOST true``. It tells a crashed host (refused), a cut one (no answer)
and a frozen one (the kernel accepts the connection, but sshd, stopped, never sends its
greeting) from a busy one (it answers). Inside a Slurm job, where mpirun starts its daemons
through ``srun`` and the nodes need not take ssh, a probe is a step of the job on that node:
``srun --jobid=JOB --overlap -N1 -n1 -w NODE true``; a node whose slurmd is gone or stopped
does not answer it within the probe's time. That command, like Grid Engine's and LSF's, is
the allocation's launcher data (:func:`agent_probe`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from poprun import log
from poprun.plan.slurm import node_addresses
from poprun.plan.topology import InstancePlan
from poprun.run import ssh_check
from poprun.run.membership.lease import LeaseServer
from poprun.run.membership.members import Membership

#: ssh's time-out in a probe (connection and greeting), seconds.
PROBE_TIMEOUT_S = 3
#: How often the supervisor's loop looks while a probe is out.
POLL_S = 0.25


#: How a probe runs: (host, shell command) -> argv.
Prober = Callable[[str, str], list[str]]


def probe_command(global_args: Sequence[str], environ: Mapping[str, str]) -> Prober | None:
    """The ssh probe: the agent, less any ``-o ControlPath=...`` (it opens its own
    connection), in batch mode with a short time-out."""
    words = ssh_agent(global_args, environ)
    if words is None:
        return None
    argv = [*words, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={PROBE_TIMEOUT_S}"]
    return lambda host, remote: [*argv, host, remote]


def agent_probe(command: Sequence[str], environ: Mapping[str, str]) -> Prober | None:
    """The probe where an engine starts commands on its nodes itself (a step of the Slurm
    job, Grid Engine's ``qrsh -inherit``, LSF's ``blaunch``): the launcher's ``probe``, its
    ``{host}`` the node, then ``/bin/sh -c REMOTE``; None when its program is not on ``PATH``
    (no probe, rather than every node lost)."""
    import shutil

    program = shutil.which(command[0], path=environ.get("PATH"))
    if program is None:
        return None
    words = [program, *command[1:]]
    return lambda host, remote: [
        *(word.replace("{host}", host) for word in words),
        "/bin/sh",
        "-c",
        remote,
    ]


def slurm_addresses(nodes: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """Where Slurm reaches ``nodes`` (their ``NodeAddr``, ``scontrol show node``), in order;
    empty when scontrol does not answer within a few seconds."""
    try:
        done = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(nodes)], env=dict(environ),
            capture_output=True, text=True, timeout=PROBE_TIMEOUT_S + 2, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = node_addresses(done.stdout)
    return [found[node] for node in nodes if node in found]


def ssh_agent(global_args: Sequence[str], environ: Mapping[str, str]) -> list[str] | None:
    """The agent and Open MPI's ``plm_rsh_args`` (a port), less any ``-o ControlPath=...``,
    with no master of its own."""
    words = ssh_check.agent(global_args, environ)
    if words is None:
        return None
    words = [*words, *ssh_check.rsh_args(global_args, environ)]
    kept: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word == "-o" and i + 1 < len(words) and words[i + 1].startswith("ControlPath="):
            skip = True
            continue
        if word.startswith("-oControlPath="):
            continue
        kept.append(word)
    return [*kept, "-o", "ControlMaster=no", "-o", "ControlPath=none"]


def leftover_check(lease: str) -> str:
    """A shell command that fails while a process of this job runs on the host: its
    environment holds the lease's address. Only processes of the host's own network
    namespace count (hosts made of namespaces on one machine share their process table)."""
    return (
        "me=$(readlink /proc/self/ns/net); for p in /proc/[0-9]*; do "
        '[ "$(readlink $p/ns/net 2>/dev/null)" = "$me" ] && '
        f"grep -qs 'POPDIST_LEASE={lease}' $p/environ && exit 1; done; exit 0"
    )


class HostWatch:
    """Feeds a membership from the board and the lease, and runs its probes."""

    def __init__(
        self,
        membership: Membership,
        command: Prober | None,
        lease: LeaseServer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.membership = membership
        self.command = command
        self.lease = lease
        self.clock = clock
        # As many at once as the ssh check tries (threads start only as probes need them):
        # a failing attempt asks every member at once, and hundreds of hosts 4 at a time
        # would name a crashed one only after hosts/4 probe time-outs
        self._pool = ThreadPoolExecutor(
            max_workers=ssh_check.CONCURRENCY, thread_name_prefix="poprun-probe"
        )
        self._probes: dict[str, Future[str]] = {}
        self._hosts: dict[int, str] = {}
        self._reports: Callable[[], dict[int, float]] = dict
        #: The membership decides the probes at most every POLL_S (its questions walk every
        #: host; the loop turns once per event): when next, whether one was put off, and
        #: when it said it would next have something to do.
        self._decide_at = 0.0
        self._deferred = False
        self._next: float | None = None
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._stopped = False
        #: The ssh check's masters (``poprun.run.ssh_check.SharedConnections``), if kept.
        self.connections: ssh_check.SharedConnections | None = None

    def attach(
        self, instances: Sequence[InstancePlan], reports: Callable[[], dict[int, float]]
    ) -> None:
        """A new attempt: its instances, and its progress board's reports since the last look
        (:meth:`~poprun.run.progress.board.ProgressBoard.take_reports`)."""
        self._hosts = {plan.index: plan.host for plan in instances}
        self._reports = reports
        self._stopped = False
        self._decide_at, self._deferred = 0.0, False
        if self.lease is not None:
            self.lease.begin(self.membership.generation)
        self.membership.launched(self._hosts)

    def drop_lost(self) -> None:
        """The job ends on a loss: stop the lost hosts' ssh masters at once, which hold open
        the output of mpirun's sessions with them (else mpirun's output outlives it)."""
        if self.connections is not None:
            self.connections.drop([loss.host for loss in self.membership.losses])

    def tick(self) -> None:
        """What was heard (only what came since the last tick), the probes that ended, the
        probes to start (decided at most every :data:`POLL_S`)."""
        members = self.membership
        heard: dict[str, float] = {}
        for source in (self._reports(), self.lease.take_heard() if self.lease else {}):
            for instance, at in source.items():
                host = self._hosts.get(instance)
                if host is not None and at > heard.get(host, 0.0):
                    heard[host] = at
        for host, at in heard.items():
            members.heard(host, at)
        for host, future in list(self._probes.items()):
            if future.done():
                del self._probes[host]
                why = future.result()
                log.debug(f"probe of {host}: {why or 'it answers'}")
                members.answered(host, not why, why)
        if self.command is None:
            return
        now = self.clock()
        self._deferred = now < self._decide_at
        if self._deferred:
            return
        self._decide_at = now + POLL_S
        for host in members.to_probe():
            self._probes[host] = self._pool.submit(self._probe, host)
        self._next = members.next_time()

    def probe_now(self, hosts: Sequence[str]) -> None:
        """Ask ``hosts`` at once and wait for the answers (after a failed attempt); a probe
        still out since the failure began is waited for, not asked again."""
        if self.command is None or not hosts:
            return
        self._stopped = False
        asked = {}
        for host in hosts:
            out = self._probes.pop(host) if host in self._probes else None
            asked[host] = out or self._pool.submit(self._probe, host)
        for host, future in asked.items():
            why = future.result()
            log.debug(f"probe of {host}: {why or 'it answers'}")
            self.membership.answered(host, not why, why)

    def wait_s(self) -> float | None:
        """How long the loop may wait: briefly while a probe is out or a decision was put
        off, else until the membership's next (as it said at the last decision); with no
        probe command nothing is ever asked, so nothing to wait for (a silent host's time,
        already past, would turn the loop at once for ever)."""
        if self.command is None:
            return None
        if self._probes:
            return POLL_S
        now = self.clock()
        if self._deferred:
            return max(0.0, self._decide_at - now)
        return None if self._next is None else max(0.0, self._next - now)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.lease is not None:
            self.lease.close()

    def _probe(self, host: str) -> str:
        """Empty when ``host`` answers (and, lost, holds nothing of this job), else why not."""
        assert self.command is not None
        remote = "true"
        if self.membership.is_out(host) and self.lease is not None:
            remote = leftover_check(self.lease.address)
        return self._ask(host, remote)

    def probe_pids(self) -> set[int]:
        """The probes' pids now (poprun's own processes, not the job's)."""
        with self._lock:
            return {proc.pid for proc in self._running}

    def stop_probes(self, *, unless_failing: bool = False) -> None:
        """The attempt is ending: kill the probes still out (by pid, each its own session),
        so none outlives the job; their answers are dropped (the next attempt asks anew).
        ``unless_failing``: not while the attempt is failing (``--min-hosts``), whose probes
        :meth:`probe_now` then waits for."""
        if unless_failing and self.membership.failing_since is not None:
            return
        with self._lock:
            self._stopped = True
            running = list(self._running)
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in running:
            proc.wait()
        self._probes.clear()

    def _ask(self, host: str, remote: str) -> str:
        """Run ``remote`` on ``host`` through the agent: empty when it succeeds, else why."""
        assert self.command is not None
        argv = self.command(host, remote)
        with self._lock:
            if self._stopped:
                return ""
            try:
                proc = subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                )  # fmt: skip
            except OSError as error:
                return f"cannot run {argv[0]}: {error.strerror}"
            self._running.add(proc)
        try:
            _, err = proc.communicate(timeout=PROBE_TIMEOUT_S + 2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return f"nothing within {PROBE_TIMEOUT_S + 2} s"
        finally:
            with self._lock:
                self._running.discard(proc)
        if proc.returncode == 0:
            return ""
        lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        if proc.returncode != 255 and not lines:
            return "something of the job is still running there"
        return lines[-1].strip() if lines else f"exit code {proc.returncode}"
