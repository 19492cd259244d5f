"""The job's processes on this host: its instances by pid and process group, and what they
leave behind.

:mod:`poprun.run.ending` decides *when* to signal or kill (and the supervisor,
:class:`~poprun.run.supervisor.Supervisor`, carries it out); this module knows *whom*: the local instances (by pid, from mpirun's pid lines), their process groups,
mpirun's other children, the Open MPI shared-memory files of instances poprun kills, and the
orphans that re-parent to poprun (a child subreaper). Everything is addressed by id, never by
name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping

from poprun import log
from poprun.plan.hosts import is_local
from poprun.plan.topology import Topology
from poprun.run import leftovers

#: Once every instance has exited while mpirun has not: how long mpirun gets to end before
#: poprun kills what the instances left behind (a child holding their output open keeps
#: mpirun waiting for ever).
ORPHAN_GRACE_S = 2.0
#: In a Slurm job, the ``srun`` processes mpirun started its daemons with end by themselves a
#: moment after it (about 50 ms: their step ends with the daemons); until then they are
#: mpirun's launchers, not something the job left behind, and killing them would leave their
#: step to Slurm's own clean-up. They get this long once mpirun has gone.
SCHEDULER_GRACE_S = 3.0
#: mpirun's ssh connections to its remote daemons end by themselves a moment after it; they
#: get this long before they are killed (and they are never reported as left behind).
LAUNCH_GRACE_S = 1.0


class JobProcesses:
    """The local processes of one run of mpirun, and what was done to them."""

    def __init__(self, topology: Topology, pids: Mapping[int, int]) -> None:
        self.topology = topology
        self.pids = pids  # instance -> pid, filled as mpirun's pid lines arrive
        self.exited: list[int] = []  # local instances in the order they ended
        self._ended: set[int] = set()  # ... as a set (constant time a question)
        here = {host: is_local(host) for host in topology.hosts}
        #: The instances on this host (the others are mpirun's to see end).
        self.local = frozenset(p.index for p in topology.instances if here.get(p.host, False))
        self.mpirun_pid: int | None = None
        self.left_behind: list[str] = []
        self.segments: set[str] = set()  # Open MPI segments of instances killed by poprun
        self.orphans_at: float | None = None
        #: The job ends on a lost host: its ssh connections are not waited for.
        self.host_lost = False
        self._pgids: dict[int, int] = {}  # instance -> its own process group (local ones)
        #: poprun's children from before mpirun started (an in-process caller's own), never
        #: the job's: :class:`~poprun.run.launch.Launch` notes them.
        self.not_ours: set[int] = set()
        #: poprun's own processes besides mpirun (the host watch's probes), never leftovers.
        self.own_pids: Callable[[], set[int]] = set

    def ended(self, instance: int) -> None:
        """A local instance has exited (its pidfd said so)."""
        self.exited.append(instance)
        self._ended.add(instance)

    def adopt(self, instance: int, pid: int) -> None:
        """Remember a local instance's process group (Open MPI gives each its own)."""
        with contextlib.suppress(OSError):
            pgid = os.getpgid(pid)
            if pgid == pid:
                self._pgids[instance] = pgid

    def local_pids(self) -> list[int]:
        """Pids of the live local instances that have not exited, in instance order."""
        return [
            pid
            for index, pid in sorted(self.pids.items())
            if index in self.local and index not in self._ended
        ]

    def running(self) -> list[int]:
        """Instances not known to have ended (remote ones and those without a pid count)."""
        running = []
        for plan in self.topology.instances:
            if plan.index in self._ended:
                continue
            pid = self.pids.get(plan.index)
            if pid is None or plan.index not in self.local or leftovers.alive(pid):
                running.append(plan.index)
        return running

    def signal_instances(self, signum: int) -> None:
        """Signal, by pid, every live instance on this host (mpirun then ends the job)."""
        for pid in self.local_pids():
            if leftovers.alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)

    def signal_groups(self, signum: int) -> None:
        """Signal each live local instance's process group (it and its children), by id.

        The groups are those of the instances whose pid poprun knows and of mpirun's other
        children (an instance whose pid line has not arrived yet is one of them).
        """
        groups = {self._pgids[i] for i in self._pgids if i not in self._ended}
        own = {os.getpgid(0)}
        if self.mpirun_pid is not None:
            own.add(self.mpirun_pid)  # mpirun leads its own session and group
            for child in leftovers.children(self.mpirun_pid):
                with contextlib.suppress(OSError):
                    groups.add(os.getpgid(child))
        for pgid in groups - own:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signum)

    def remember_segments(self) -> None:
        """Before killing: the shared-memory files the live local instances have mapped."""
        for index, pid in self.pids.items():
            if index in self.local:
                self.segments |= leftovers.segments_of(pid)

    def kill_left_behind(self, keep: set[int]) -> None:
        """SIGKILL and reap, by pid, every process the job left under poprun; remember them.

        mpirun's own ssh connections get :data:`LAUNCH_GRACE_S` to end first, unless the job
        ends on a lost host (:attr:`host_lost`), whose connection would not end."""
        keep = keep | self.not_ours | self.own_pids()
        # (after a lost node, mpirun's srun to it does not end by itself either)
        allocation = self.topology.allocation
        lingers = allocation is not None and allocation.launcher.lingers and not self.host_lost
        if lingers and self.mpirun_pid not in keep:
            self._let_launchers_end(keep)
        found = leftovers.left_behind(keep)
        # mpirun's own ssh connections to its daemons may outlive it by a moment: poprun's
        # connections, not the job's leftovers (a clean run must not read like a clean-up)
        ours = [pid for pid in found if leftovers.launch_connection(pid)]
        deadline = time.monotonic() + (0.0 if self.host_lost else LAUNCH_GRACE_S)
        while ours and len(ours) == len(found) and time.monotonic() < deadline:
            time.sleep(0.02)
            self._reap_children(keep)
            found = leftovers.left_behind(keep)
            ours = [pid for pid in found if leftovers.launch_connection(pid)]
        if not found:
            return
        described = leftovers.describe([pid for pid in found if pid not in ours])
        killed = leftovers.kill_and_reap(keep)
        log.info(f"killed what the job left behind: {leftovers.describe(found)}")
        if killed and described:
            self.left_behind.append(described)

    @staticmethod
    def _reap_children(keep: set[int]) -> None:
        for pid in leftovers.children(os.getpid()):
            if pid not in keep:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def _let_launchers_end(self, keep: set[int]) -> None:
        """Wait (at most :data:`SCHEDULER_GRACE_S`) for what mpirun left to end by itself."""
        deadline = time.monotonic() + SCHEDULER_GRACE_S
        while leftovers.left_behind(keep) and time.monotonic() < deadline:
            for pid in leftovers.children(os.getpid()):
                if pid not in keep:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
            time.sleep(0.01)

    def watch_for_orphans(self) -> None:
        """All instances (all local) exited but mpirun runs on: a child holds their output."""
        if len(self.local) != len(self.topology.instances) or len(self._ended) < len(self.local):
            return
        now = time.monotonic()
        if self.orphans_at is None:
            self.orphans_at = now + ORPHAN_GRACE_S
        elif now >= self.orphans_at:
            self.orphans_at = None
            log.info("every instance has exited but mpirun has not: ending what they left")
            self.kill_left_behind(keep=set() if self.mpirun_pid is None else {self.mpirun_pid})

    def job_control(self, signum: int) -> float:
        """Ctrl-Z: stop the instances, then poprun itself; on SIGCONT, continue them.

        Returns how long poprun was stopped (the time-out does not count it).
        """
        if signum != signal.SIGTSTP:
            self.signal_groups(signal.SIGCONT)
            return 0.0
        log.info("received SIGTSTP: stopping the instances and poprun")
        self.signal_groups(signal.SIGSTOP)
        began = time.monotonic()
        os.kill(os.getpid(), signal.SIGSTOP)  # a shell sees poprun stopped; fg continues it
        stopped_for = time.monotonic() - began
        log.info("continued: continuing the instances")
        self.signal_groups(signal.SIGCONT)
        return stopped_for

    def remove_session_files(self, env: Mapping[str, str]) -> None:
        """After poprun killed mpirun: the session dir and segments it could not remove."""
        if self.mpirun_pid is None:
            return
        for path in leftovers.remove_session_files(self.mpirun_pid, env, self.segments):
            log.info(f"removed {path}, left by the killed mpirun")
