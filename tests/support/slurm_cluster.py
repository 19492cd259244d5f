"""A real two-node Slurm cluster on this one machine, for the Slurm test tier and benchmark.

:class:`SlurmCluster` writes a ``slurm.conf`` into a private temporary directory (free
loopback ports, ``auth/none`` so no munge), starts ``slurmctld`` and one ``slurmd`` per node
(``n1``, ``n2``), each in its own process group, and waits until ``sinfo`` shows every node
idle (polled against a deadline). Jobs are submitted with :meth:`SlurmCluster.salloc`,
:meth:`SlurmCluster.sbatch` and :meth:`SlurmCluster.srun`, whose environment points
``SLURM_CONF`` at the private configuration (and carries none of the caller's own ``SLURM_*``
variables: the tier may itself run inside a real job).

Both node names resolve to this machine (``NodeHostname`` is its hostname, ``NodeAddr``
127.0.0.1; distinct slurmd ports and ``%n`` in the spool, pid and ``TmpFS`` paths tell them
apart), so "remote" instances are local processes: the tier tests the allocation, the plan
and the launch, not the network (the namespace hosts of ``tests/multihost`` test that).
Each slurmd runs in a UTS namespace of its own whose hostname is its node name
(:func:`own_hostname`), so a job's processes on ``n2`` see ``n2`` as their hostname: Open MPI
names its session directories and shared-memory segments after the hostname, and with one
name for both nodes their processes corrupt each other's segments (a segfault in
``mca_btl_vader`` at the first collective).

Stopping ends the daemons by the pids this class started, then every ``slurmstepd`` of *this*
cluster that outlived them (one can survive its slurmd and SIGTERM, re-parented to init:
``../shared/reference/slurm.md``), and the processes under it. A step daemon is recognised
by the Unix socket it listens on, ``<private dir>/spool/<node>/<node>_<job>.<step>``, found
through ``/proc/net/unix`` and its open descriptors: by path and pid, never by name. Stopping
then checks that nothing of the cluster survives.

``python -m tests.support.slurm_cluster check`` says whether this machine can run the tier
(``check --start`` also starts and stops a cluster); ``up`` keeps one running until Ctrl-C and
prints the ``SLURM_CONF`` to use. Needs root (slurmd runs jobs as their user) and Debian's
``slurm-wlm`` (``scripts/setup.sh`` installs it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import (
    HARNESS_DAEMONS,
    end_with_parent,
    reap_children,
    run_in_session,
)

ROOT = Path(__file__).resolve().parents[2]
DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sinfo", "squeue", "salloc", "sbatch", "srun", "scontrol", "scancel")
#: How long the daemons get to come up (they take about a second), and to end.
READY_S = 30.0
STOP_S = 10.0
#: The environment of jobs: what the tier removes from the caller's before adding its own.
_DROP_PREFIXES = ("SLURM_", "SLURMD_", "POPDIST_", "OMPI_", "PMIX_", "HOROVOD_")


def _find(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be started here, or None when it can."""
    if sys.platform != "linux":
        return "the Slurm test cluster needs Linux"
    missing = [name for name in (*DAEMONS, *CLIENTS) if _find(name) is None]
    if missing:
        return (
            f"Slurm is not installed ({', '.join(missing)} missing); "
            "scripts/setup.sh installs it as root (apt-get install slurm-wlm)"
        )
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (slurmd starts jobs as their user)"
    if _find("unshare") is None:
        return "unshare (util-linux) is missing: each test node needs a hostname of its own"
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (scripts/setup.sh installs Open MPI)"
    return None


def own_hostname(name: str) -> list[str]:
    """An argv prefix that runs a command in a UTS namespace of its own named ``name``.

    The pid stays the command's (``unshare`` and ``sh`` exec it). Each slurmd gets one, so
    the processes of a node see the node's name as their hostname, as on separate machines:
    Open MPI tells nodes apart by hostname (its session directories and shared-memory
    segments are named after it, and two nodes of one name share and corrupt them), and
    poprun started on ``n1`` (an ``sbatch`` script) knows ``n1`` as its own host.
    """
    return [_path("unshare"), "--uts", "/bin/sh", "-c", f'hostname {name} && exec "$@"', "sh"]


def free_ports(count: int, contiguous: bool = False) -> list[int]:
    """``count`` TCP ports free on loopback now; ``contiguous``: consecutive ones.

    slurmd ports of several nodes on one host are given as a range (``Port=[a-b]``), hence
    the consecutive block. Free at the time of the check: the daemons bind them moments later.
    """
    if not contiguous:
        out = []
        for _ in range(count):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                out.append(probe.getsockname()[1])
        return out
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        if first + count > 65000:
            continue
        ports = list(range(first, first + count))
        if all(_port_free(port) for port in ports):
            return ports
    raise RuntimeError(f"found no {count} consecutive free ports on 127.0.0.1")


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _alive(pid: int) -> bool:
    """Running: not gone and not a zombie (this container's init reaps orphans late)."""
    return _state(pid) not in ("", "Z", "X")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out.extend(
                    int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                )
    return out


def _tree(roots: Sequence[int]) -> list[int]:
    """``roots`` and their live descendants, parents first."""
    seen: list[int] = []
    stack = list(roots)
    while stack:
        pid = stack.pop(0)
        if pid in seen or not _alive(pid):
            continue
        seen.append(pid)
        stack.extend(_children(pid))
    return seen


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


class SlurmCluster:
    """``slurmctld`` and ``nodes`` slurmds (``n1``, ``n2``, ...) with ``cpus`` CPUs each."""

    def __init__(
        self, nodes: int = 2, cpus: int = 4, partition: str = "debug", extra: Sequence[str] = ()
    ) -> None:
        self.node_names = tuple(f"n{i}" for i in range(1, nodes + 1))
        self.cpus = cpus
        self.partition = partition
        #: More ``slurm.conf`` lines (``SlurmdTimeout=5``: a lost node declared down soon).
        self.extra = tuple(extra)
        self.dir = Path(tempfile.mkdtemp(prefix="slurm-"))
        self.conf = self.dir / "slurm.conf"
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: list[str] = []  # what stop() had to kill besides the daemons
        self._started = False

    # --- lifecycle ------------------------------------------------------------------------

    def write_conf(self) -> None:
        """``slurm.conf`` with free ports; every path in the private directory."""
        ctld_port = free_ports(1)[0]
        node_ports = free_ports(len(self.node_names), contiguous=True)
        for sub in ("state", "spool", "tmp", "log"):
            (self.dir / sub).mkdir(exist_ok=True)
        for node in self.node_names:
            (self.dir / "tmp" / node).mkdir(exist_ok=True)  # TmpFS: PMIx needs it
            (self.dir / "spool" / node).mkdir(exist_ok=True)
        d = self.dir
        nodes = f"n[1-{len(self.node_names)}]" if len(self.node_names) > 1 else "n1"
        ports = f"[{node_ports[0]}-{node_ports[-1]}]" if len(node_ports) > 1 else str(node_ports[0])
        lines = [
            "ClusterName=box",
            "SlurmctldHost=localhost",
            "AuthType=auth/none",
            "CredType=cred/none",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "MpiDefault=none",
            "ReturnToService=2",
            f"SlurmctldPort={ctld_port}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"TmpFS={d}/tmp/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/log/slurmctld.log",
            f"SlurmdLogFile={d}/log/slurmd-%n.log",
            "SlurmUser=root",
            # Jobs killed at their time limit go at once (the time-limit tests wait for it).
            "KillWait=2",
            f"NodeName={nodes} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 "
            f"CPUs={self.cpus} Port={ports}",
            f"PartitionName={self.partition} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP",
            *self.extra,
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self) -> SlurmCluster:
        """Start the daemons and wait until every node is idle; on failure, stop and raise."""
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        self._started = True
        try:
            self.write_conf()
            self._spawn("slurmctld", [_path("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            for node in self.node_names:
                slurmd = [_path("slurmd"), "-D", "-N", node, "-f", str(self.conf)]
                self._spawn(node, [*own_hostname(node), *slurmd])
            self.wait_idle()
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.dir / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the daemon keeps it
        try:
            self.daemons[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                cwd=self.dir,
                start_new_session=True,  # own process group: ended by pid, not by a signal to ours
                # and ended with this process if it dies before stop() (a killed test run)
                preexec_fn=functools.partial(end_with_parent, os.getpid()),
            )
        finally:
            out.close()
        HARNESS_DAEMONS.add(self.daemons[name].pid)

    def wait_idle(self, within: float = READY_S) -> None:
        """Poll ``sinfo`` until every node reports idle; a daemon's death ends the wait."""
        deadline = time.monotonic() + within
        last = ""
        while True:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} while starting:\n{self.log_tail(name)}"
                    )
            states = self.node_states()
            last = ", ".join(f"{n} {s}" for n, s in sorted(states.items())) or last
            if (
                states
                and set(states) == set(self.node_names)
                and all(s.startswith("idle") for s in states.values())
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Slurm nodes were not idle within {within:g} s ({last or 'no answer'}):\n"
                    f"{self.log_tail('slurmctld')}"
                )
            time.sleep(0.1)

    def node_states(self) -> dict[str, str]:
        """``{node: state}`` as ``sinfo -N`` reports it (empty while slurmctld does not answer)."""
        try:
            done = subprocess.run(
                [_path("sinfo"), "-h", "-N", "-o", "%N %T"],
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=10,
            )
        except subprocess.TimeoutExpired:
            return {}
        if done.returncode != 0:
            return {}
        out: dict[str, str] = {}
        for line in done.stdout.splitlines():
            fields = line.split()
            if len(fields) == 2:
                out[fields[0]] = fields[1]
        return out

    def stop(self, check: bool = True) -> None:
        """End the daemons by pid, then whatever of this cluster outlived them; then check.

        ``check``: raise if anything of the cluster is still running afterwards.
        """
        if not self._started:
            return
        self._started = False
        steps = self.step_daemons()
        doomed = _tree([p.pid for p in self.daemons.values() if p.poll() is None] + steps)
        for proc in self.daemons.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_S
        for proc in self.daemons.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.killed.append(f"{proc.pid} ({_comm(proc.pid)}, did not end on SIGTERM)")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        # Step daemons (and their tasks) that outlive slurmd: found again now, by socket path.
        left = [p for p in _tree([*doomed, *self.step_daemons()]) if _alive(p)]
        for pid in left:
            self.killed.append(f"{pid} ({_comm(pid)})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        survivors = self._wait_gone(left, within=STOP_S)
        reap_children()
        HARNESS_DAEMONS.difference_update(p.pid for p in self.daemons.values())
        if not survivors:
            shutil.rmtree(self.dir, ignore_errors=True)
        if check and survivors:
            raise RuntimeError(f"the Slurm cluster left processes running: {survivors}")

    def _wait_gone(self, pids: Sequence[int], within: float) -> list[str]:
        deadline = time.monotonic() + within
        while True:
            reap_children()
            running = [p for p in pids if _alive(p)] + [
                p for p in self.step_daemons() if p not in pids
            ]
            if not running or time.monotonic() > deadline:
                return [f"{p} ({_comm(p)})" for p in running]
            time.sleep(0.05)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(check=exc[0] is None)

    # --- this cluster's processes ----------------------------------------------------------

    def lose(self, node: str) -> list[int]:
        """The node lost as a crashed machine loses it: SIGKILL, by pid, its slurmd, its step
        daemons and everything under them (Open MPI's daemon, the instances). Returns the
        pids killed. Slurm notices only when slurmctld's pings go unanswered."""
        doomed = _tree([self.daemons[node].pid, *self.step_daemons(node)])
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.daemons[node].wait()
        reap_children()
        return doomed

    def step_daemons(self, node: str = "") -> list[int]:
        """Live ``slurmstepd`` processes of this cluster (of ``node`` only, if given): those
        holding a Unix socket under its spool directory (``<node>_<job>.<step>``)."""
        spool = f"{self.dir}/spool/{node + '/' if node else ''}"
        inodes: set[str] = set()
        with contextlib.suppress(OSError), open("/proc/net/unix") as table:
            for line in table:
                fields = line.split()
                if len(fields) >= 8 and fields[7].startswith(spool):
                    inodes.add(f"socket:[{fields[6]}]")
        if not inodes:
            return []
        daemons = {p.pid for p in self.daemons.values()}
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in daemons:
                continue
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{entry}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                            if _alive(int(entry)):
                                found.append(int(entry))
                            break
        return found

    def jobs(self) -> list[str]:
        """``JOBID STATE`` of every job slurmctld still lists."""
        done = self.client("squeue", "-h", "-o", "%i %T")
        return [line for line in done.stdout.splitlines() if line.strip()]

    def wait_clean(self, within: float = 15.0) -> list[str]:
        """Wait until no job runs and no step daemon is left; return what still is (if any)."""
        deadline = time.monotonic() + within
        while True:
            reap_children()
            busy = [*self.jobs(), *(f"slurmstepd {p}" for p in self.step_daemons())]
            if not busy or time.monotonic() > deadline:
                return busy
            time.sleep(0.1)

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last lines of a daemon's log (``slurmctld`` or a node name)."""
        texts = []
        log_name = "slurmctld.log" if name == "slurmctld" else f"slurmd-{name}.log"
        for path in (self.dir / "log" / log_name, self.dir / "log" / f"{name}.out"):
            with contextlib.suppress(OSError):
                texts.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(texts[-lines:])

    # --- running clients and jobs ----------------------------------------------------------

    def env(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """``base`` (default: this process's environment) with none of the caller's Slurm or
        launcher variables, ``SLURM_CONF`` pointing at this cluster, and ``extra``."""
        source = os.environ if base is None else base
        out = {k: v for k, v in source.items() if not k.startswith(_DROP_PREFIXES)}
        out["SLURM_CONF"] = str(self.conf)
        out.update(extra)
        return out

    def client(
        self, name: str, *args: str, timeout: float = 30, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (``squeue``, ``scontrol``, ...) run to its end, output captured."""
        return subprocess.run(
            [_path(name), *args],
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path = ROOT,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` in its own session against this cluster, stdout and stderr merged; past
        ``timeout`` its process group is killed (by id) and :class:`TimeoutError` raised."""
        return run_in_session(argv, env=self.env(env), cwd=cwd, timeout=timeout)

    def salloc(
        self, alloc: Sequence[str], command: Sequence[str], **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        """``salloc ALLOC COMMAND``: COMMAND runs here (the launch host) inside a new allocation."""
        return self.run([_path("salloc"), *alloc, *command], **kwargs)  # type: ignore[arg-type]

    def srun(
        self, alloc: Sequence[str], command: Sequence[str], **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        """``srun ALLOC COMMAND``: a job (or, inside one, a step) running COMMAND on its nodes."""
        return self.run([_path("srun"), *alloc, *command], **kwargs)  # type: ignore[arg-type]

    def submit(
        self, script: str, alloc: Sequence[str] = (), *, env: Mapping[str, str] | None = None
    ) -> tuple[int, Path]:
        """Submit ``script`` (its text) with ``sbatch ALLOC``; (job id, its output file).

        The script runs on the first node, in this repository's root unless ``--chdir``.
        """
        handle, path = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.dir)
        with os.fdopen(handle, "w") as out:
            out.write(script)
        os.chmod(path, 0o755)
        output = Path(f"{path}.out")
        done = self.run(
            [_path("sbatch"), "--parsable", "-o", str(output), *alloc, path], env=env, timeout=30
        )
        first = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not first.isdigit():
            raise RuntimeError(f"sbatch failed ({done.returncode}):\n{done.stdout}")
        return int(first), output

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields (``JobState``, ``ExitCode``, ``Restarts``, ...)."""
        done = self.client("scontrol", "-o", "show", "job", str(job_id))
        fields: dict[str, str] = {}
        for word in done.stdout.split():
            key, sep, value = word.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def wait_job(self, job_id: int, *, timeout: float = 120, poll: float = 0.1) -> JobEnd:
        """Wait until the job has ended (a final state, not a requeue); its state and exit code.

        Polls ``scontrol`` (``sbatch --wait`` polls only every few seconds).
        """
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            state = fields.get("JobState", "")
            if state in FINAL_STATES:
                code, _, signum = fields.get("ExitCode", "0:0").partition(":")
                return JobEnd(job_id, state, int(code or 0), int(signum or 0), fields)
            if time.monotonic() > deadline:
                self.client("scancel", str(job_id))
                raise TimeoutError(
                    f"Slurm job {job_id} still {state or 'unknown'} after {timeout} s"
                )
            time.sleep(poll)

    def sbatch(
        self,
        script: str,
        alloc: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
    ) -> tuple[int, str, subprocess.CompletedProcess[str]]:
        """Submit ``script`` with ``sbatch ALLOC`` and wait for its end, as ``sbatch --wait``
        does but polled every 0.1 s (``--wait`` polls every few seconds).

        Returns (job id, the job's output file's text, a result whose ``returncode`` is the
        batch script's exit code, 128+N for signal N, and whose ``stdout`` is its final state).
        """
        job_id, output = self.submit(script, alloc, env=env)
        end = self.wait_job(job_id, timeout=timeout)
        text = output.read_text(errors="replace") if output.exists() else ""
        code = 128 + end.signal if end.signal else end.exit_code
        return job_id, text, subprocess.CompletedProcess(["sbatch", *alloc], code, end.state, None)


@dataclass(frozen=True)
class JobEnd:
    """How a batch job ended: ``state`` (``COMPLETED``, ``FAILED``, ...), the batch script's
    exit code (or the signal that ended it), and every ``scontrol show job`` field."""

    job_id: int
    state: str
    exit_code: int
    signal: int
    fields: Mapping[str, str]


#: Job states after which a job will not run again (a requeued job passes through others).
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


def _path(name: str) -> str:
    found = _find(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (apt-get install slurm-wlm)")
    return found


@contextlib.contextmanager
def cluster(nodes: int = 2, cpus: int = 4) -> Iterator[SlurmCluster]:
    """A running cluster for the duration of the block, stopped and checked afterwards."""
    with SlurmCluster(nodes, cpus) as made:
        yield made


def main(argv: list[str]) -> int:
    """``check [--start]``: can this machine run the Slurm tier? ``up``: a cluster until Ctrl-C."""
    if argv[:1] == ["check"]:
        reason = unavailable()
        if reason is None and argv[1:] == ["--start"]:
            try:
                started = time.monotonic()
                with cluster() as made:
                    took = time.monotonic() - started
                    nodes = ", ".join(made.node_names)
                print(
                    f"Slurm tier: runs (a cluster of {nodes} started in {took:.2f} s and stopped)"
                )
                return 0
            except RuntimeError as error:
                reason = f"a test cluster did not start: {error}"
        if reason is None:
            print(
                "Slurm tier: runs (slurm-wlm installed, root: a two-node test cluster can be made)"
            )
            return 0
        print(f"Slurm tier: skipped: {reason}")
        return 1
    if argv[:1] == ["up"]:
        from tests.support.processes import become_subreaper

        become_subreaper()  # step daemons that detach re-parent here, not to init

        def interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt  # SIGTERM too (a background job ignores SIGINT)

        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGINT, interrupt)
        started = time.monotonic()
        with cluster() as made:
            print(f"nodes {', '.join(made.node_names)} idle in {time.monotonic() - started:.2f} s")
            print(f"use:  export SLURM_CONF={made.conf}")
            print("daemons:", " ".join(str(p.pid) for p in made.daemons.values()))
            print("Ctrl-C or SIGTERM stops the cluster.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(1.0)
                    reap_children()  # step daemons that ended, re-parented here
        return 0
    print("usage: python -m tests.support.slurm_cluster check [--start] | up", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
