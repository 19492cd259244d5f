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
greeting) from a busy one (it answers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from poprun.plan.topology import InstancePlan
from poprun.run import ssh_check
from poprun.run.membership.lease import LeaseServer
from poprun.run.membership.members import Membership
from poprun.run.progress.board import InstanceFigures

#: ssh's time-out in a probe (connection and greeting), seconds.
PROBE_TIMEOUT_S = 3
#: How often the supervisor's loop looks while a probe is out.
POLL_S = 0.25


def probe_command(global_args: Sequence[str], environ: Mapping[str, str]) -> list[str] | None:
    """The agent, less any ``-o ControlPath=...`` (the probe opens its own connection)."""
    words = ssh_check.agent(global_args, environ)
    if words is None:
        return None
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


class HostWatch:
    """Feeds a membership from the board and the lease, and runs its probes."""

    def __init__(
        self,
        membership: Membership,
        command: list[str] | None,
        lease: LeaseServer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.membership = membership
        self.command = command
        self.lease = lease
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="poprun-probe")
        self._probes: dict[str, Future[str]] = {}
        self._hosts: dict[int, str] = {}
        self._snapshot: Callable[[], list[InstanceFigures]] = list

    def attach(
        self, instances: Sequence[InstancePlan], snapshot: Callable[[], list[InstanceFigures]]
    ) -> None:
        """A new attempt: its instances and its progress board."""
        self._hosts = {plan.index: plan.host for plan in instances}
        self._snapshot = snapshot
        if self.lease is not None:
            self.lease.begin(self.membership.generation)
        self.membership.launched()

    def tick(self) -> None:
        """What was heard, the probes that ended, the probes to start."""
        members = self.membership
        for figures in self._snapshot():
            host = self._hosts.get(figures.instance)
            if host is not None and figures.reported_at:
                members.heard(host, figures.reported_at)
        if self.lease is not None:
            for instance, at in list(self.lease.heard.items()):
                host = self._hosts.get(instance)
                if host is not None:
                    members.heard(host, at)
        for host, future in list(self._probes.items()):
            if future.done():
                del self._probes[host]
                why = future.result()
                members.answered(host, not why, why)
        if self.command is None:
            return
        for host in members.to_probe():
            self._probes[host] = self._pool.submit(self._probe, host)

    def probe_now(self, hosts: Sequence[str]) -> None:
        """Ask ``hosts`` at once and wait for the answers (after a failed attempt)."""
        if self.command is None or not hosts:
            return
        for host, why in zip(hosts, self._pool.map(self._probe, hosts), strict=True):
            self.membership.answered(host, not why, why)

    def wait_s(self) -> float | None:
        """How long the loop may wait: briefly while a probe is out, else until the next."""
        if self._probes:
            return POLL_S
        at = self.membership.next_time()
        return None if at is None else max(0.0, at - self.clock())

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.lease is not None:
            self.lease.close()

    def _probe(self, host: str) -> str:
        """ "" when ``host`` answers, else why not."""
        assert self.command is not None
        failed = ssh_check.unreachable([host], self.command, timeout=PROBE_TIMEOUT_S)
        return failed[0][1] if failed else ""
