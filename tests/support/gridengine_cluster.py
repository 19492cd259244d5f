"""A real Grid Engine cell on namespace hosts, for the Grid Engine test tier and benchmark.

:class:`GridEngineCluster` makes two namespace hosts ``h1`` and ``h2``
(:mod:`tests.support.hosts`: their own network, hostname and ``/etc/hosts``, an sshd
each) and a private cell of Debian's Grid Engine 8.1.9 on them: its own ``SGE_ROOT`` (a
temporary directory, shared by the hosts as a cluster shares it over NFS) and ``SGE_CELL``,
classic spooling, written with Grid Engine's own ``spoolinit`` and ``spooldefaults`` before
any daemon starts. ``sge_qmaster`` runs in h1 and one ``sge_execd`` in each host, each in
its host's network namespace (the execd port is cell-wide: two execds on one address would
clash). The ports are Grid Engine's own (6444, 6445): inside namespaces made for this cell
no other process can hold them, so they are free by construction.

The cell holds one queue, ``all.q``, with :data:`SLOTS` slots on each host and a job
``TMPDIR`` of each host's own (``tmpdir`` per host: the hosts share ``/tmp``, and each
execd removes its job's directory at the end), and one parallel environment, ``mpi``:
``control_slaves TRUE`` (Open MPI's daemons start through ``qrsh -inherit``, under the
execd and its shepherd), ``job_is_first_task FALSE``, ``allocation_rule $round_robin``.
The scheduler runs every second and at each submit; accounting is written at once
(a job's accounting record, with its exit status, is there as soon as it ends).

The daemons start in the foreground (``SGE_ND``) with :meth:`Hosts.spawn_daemon`: each in a
session of its own, ended with this process if it dies, and ended by pid at :meth:`stop`,
which then ends by pid whatever of the cell's jobs outlived them (shepherds, job processes:
everything in the hosts' namespaces that is not the harness's) and checks that nothing is
left. Jobs are submitted from h1 with :meth:`GridEngineCluster.qsub`; client commands run
there with :meth:`GridEngineCluster.client`.

``python -m tests.support.gridengine_cluster check`` says whether this machine can run the
tier (``check --start`` also starts and stops a cell); ``up`` keeps one running until
Ctrl-C. Needs root (namespaces; the execd starts jobs as their user) and Debian's
``gridengine-master``, ``gridengine-exec`` and ``gridengine-client`` (``scripts/setup.sh``
installs them). Facts behind the recipe: ``docs/clusters.md`` ("The test tiers in detail").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support import gridengine_cell as cell
from tests.support.hosts import Hosts
from tests.support.hosts import unavailable as hosts_unavailable
from tests.support.processes import reap_children, run_in_session

ROOT = Path(__file__).resolve().parents[2]
#: Debian's layout: the real binaries here, wrappers of the clients in /usr/bin.
SGE_LIB = Path("/usr/lib/gridengine")
SGE_SHARE = Path("/usr/share/gridengine")
DAEMONS = ("sge_qmaster", "sge_execd", "sge_shepherd")
CLIENTS = ("qsub", "qstat", "qdel", "qconf", "qacct", "qrsh", "qhost")
CELL = "popdist"
ARCH = "lx-amd64"
QUEUE = "all.q"
PE = "mpi"
SLOTS = 2
QMASTER_PORT, EXECD_PORT = 6444, 6445
#: How long the daemons get to come up (a few seconds on 2 busy cores) and to end.
READY_S = 60.0
STOP_S = 10.0
#: The caller's variables no job here may inherit: another engine's, a launcher's.
_DROP_PREFIXES = ("SGE_", "SLURM_", "PBS_", "LSB_", "POPDIST_", "OMPI_", "PMIX_", "HOROVOD_")
_DROP = frozenset({"PE_HOSTFILE", "JOB_ID", "ARC", "NSLOTS", "NHOSTS", "PE", "QUEUE", "TMPDIR"})


def unavailable() -> str | None:
    """Why a Grid Engine cell cannot be started here, or None when it can."""
    if sys.platform != "linux":
        return "the Grid Engine test cell needs Linux"
    missing = [n for n in (*DAEMONS, *CLIENTS, "spoolinit") if not (SGE_LIB / n).exists()]
    if missing:
        return (
            f"Grid Engine is not installed ({', '.join(missing)} missing); scripts/setup.sh "
            "installs it as root (gridengine-master, gridengine-exec, gridengine-client)"
        )
    if os.geteuid() != 0:
        return (
            "the Grid Engine test cell needs root (namespace hosts; execd runs jobs as their user)"
        )
    if shutil.which("mpirun") is None:
        return "mpirun is not installed (scripts/setup.sh installs Open MPI)"
    return hosts_unavailable()


#: The first fields of an accounting record (accounting(5)); the rest are named too.
ACCOUNTING = (
    "qname", "hostname", "group", "owner", "job_name", "job_number", "account", "priority",
    "submission_time", "start_time", "end_time", "failed", "exit_status", "ru_wallclock",
    "ru_utime", "ru_stime", "ru_maxrss", "ru_ixrss", "ru_ismrss", "ru_idrss", "ru_isrss",
    "ru_minflt", "ru_majflt", "ru_nswap", "ru_inblock", "ru_oublock", "ru_msgsnd",
    "ru_msgrcv", "ru_nsignals", "ru_nvcsw", "ru_nivcsw", "project", "department",
    "granted_pe", "slots", "task_number", "cpu", "mem", "io", "category", "iow", "pe_taskid",
    "maxvmem", "arid", "ar_submission_time",
)  # fmt: skip


@dataclass(frozen=True)
class JobEnd:
    """How a batch job ended, as its accounting record says: the job script's exit status
    (128+N for signal N), ``failed`` (0, or Grid Engine's code for why the job did not run to
    its end: 100 after ``qdel``), and every field of the record by name."""

    job_id: int
    exit_status: int
    failed: str
    fields: Mapping[str, str]


class GridEngineCluster:
    """``sge_qmaster`` in h1 and an ``sge_execd`` in each of ``hosts`` namespace hosts."""

    def __init__(self, hosts: int = 2) -> None:
        self.host_count = hosts
        self.dir = Path(tempfile.mkdtemp(prefix="sge-"))  # short: job paths grow under it
        self.root = self.dir  # SGE_ROOT
        self.hosts: Hosts | None = None
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}
        self.killed: list[str] = []  # what stop() had to kill besides the daemons
        self.started_s = 0.0

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        assert self.hosts is not None, "the cell is not started"
        return self.hosts.names

    def start(self) -> GridEngineCluster:
        """Make the hosts, write the cell, start the daemons and wait until every queue
        instance takes jobs; on failure, stop and raise."""
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        t0 = time.monotonic()
        try:
            self.hosts = Hosts(self.host_count)
            self.write_cell()
            self._spawn("sge_qmaster", self.names[0])
            self._wait(lambda: self.client("qconf", "-sh").returncode == 0, "sge_qmaster answers")
            self._configure()
            for host in self.names:
                self._spawn("sge_execd", host)
            self._wait(self._queues_open, "every queue instance takes jobs")
        except BaseException:
            self.stop(check=False)
            raise
        self.started_s = time.monotonic() - t0
        return self

    def write_cell(self) -> None:
        """The cell's files and its classic spool, made by Grid Engine's own tools."""
        common = self.root / CELL / "common"
        qmaster_spool = self.root / CELL / "spool" / "qmaster"
        for path in (common, qmaster_spool, self.dir / "templates"):
            path.mkdir(parents=True, exist_ok=True)
        for host in self.names:
            (self.dir / "tmp" / host).mkdir(parents=True, exist_ok=True)
        # $SGE_ROOT/bin/$ARC (where Open MPI documents it looks for qrsh) and utilbin/$ARC
        # (where the shepherd finds qrsh_starter) point at Debian's binaries.
        for sub in ("bin", "utilbin"):
            (self.root / sub).mkdir(exist_ok=True)
            (self.root / sub / ARCH).symlink_to(SGE_LIB)
        (self.root / "util").symlink_to(SGE_SHARE / "util")
        spooling = f"{common};{qmaster_spool}"
        (common / "bootstrap").write_text(cell.bootstrap(spooling, qmaster_spool))
        (common / "act_qmaster").write_text(f"{self.names[0]}\n")
        (common / "sched_configuration").write_text(cell.SCHEDULER)
        templates = cell.templates(self.dir / "templates", self.names, self.root / CELL)
        steps = [
            ["spoolinit", "classic", "libspoolc", spooling, "init"],
            ["spooldefaults", "configuration", str(templates["configuration"])],
            ["spooldefaults", "complexes", str(SGE_SHARE / "util" / "resources" / "centry")],
            ["spooldefaults", "usersets", str(SGE_SHARE / "util" / "resources" / "usersets")],
            ["spooldefaults", "managers", "root"],
            *(["spooldefaults", kind, str(templates[kind])]
              for kind in ("adminhosts", "submithosts", "exechosts", "pes")),
        ]  # fmt: skip
        for argv in steps:
            done = subprocess.run(
                [str(SGE_LIB / argv[0]), *argv[1:]],
                env=self.env(),
                capture_output=True,
                text=True,
                cwd=self.dir,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)}: {done.stdout}{done.stderr}".strip())

    def _configure(self) -> None:
        """The queue, added through the qmaster (a spooled queue gets no instances)."""
        queue = self.dir / "templates" / QUEUE
        queue.write_text(cell.queue(QUEUE, self.names, SLOTS, PE, self.dir / "tmp"))
        done = self.client("qconf", "-Aq", str(queue))
        if done.returncode != 0:
            raise RuntimeError(f"qconf -Aq: {done.stdout}")

    def _spawn(self, name: str, host: str) -> None:
        assert self.hosts is not None
        env = {**self.env(), "SGE_ND": "1"}  # no daemonizing: the pid is the daemon's
        proc = self.hosts.spawn_daemon(host, [str(SGE_LIB / name)], env=env, cwd=str(self.dir))
        self.daemons[f"{name}@{host}"] = proc

    def _wait(self, ready: object, what: str, within: float = READY_S) -> None:
        deadline = time.monotonic() + within
        while True:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail()}")
            if ready():  # type: ignore[operator]
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready within {within:g} s: {what}:\n{self.log_tail()}")
            time.sleep(0.1)

    def queue_states(self) -> dict[str, str]:
        """``{host: state letters}`` of each queue instance (``""``: it takes jobs; ``au``:
        its execd is not heard from)."""
        done = self.client("qstat", "-f", "-q", QUEUE, "-u", "nobody")
        states: dict[str, str] = {}
        for line in done.stdout.splitlines():
            fields = line.split()
            if fields and fields[0].startswith(f"{QUEUE}@"):
                host = fields[0].split("@", 1)[1]
                states[host] = fields[5] if len(fields) > 5 else ""
        return states

    def _queues_open(self) -> bool:
        states = self.queue_states()
        return set(states) == set(self.names) and not any(states.values())

    def stop(self, check: bool = True) -> None:
        """End the daemons by pid, then whatever of the cell's jobs outlived them; then
        check that nothing was left, and remove the hosts and the cell.

        ``check``: raise if anything of the cell was still running after its daemons."""
        if self.hosts is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        hosts, self.hosts = self.hosts, None
        for proc in self.daemons.values():  # all at once: the qmaster takes 4-7 s to end
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_S
        for name, proc in self.daemons.items():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                self.killed.append(f"{proc.pid} ({name}, did not end on SIGTERM)")
            hosts.end_daemon(name.split("@", 1)[1], proc, within=0)  # SIGKILL if still alive
        left = hosts.leftovers()  # shepherds and jobs the execds left running
        self.killed += [entry for entries in left.values() for entry in entries]
        hosts.close_jobs()
        survivors = hosts.wait_clean(within=STOP_S)
        hosts.close()
        reap_children()
        shutil.rmtree(self.dir, ignore_errors=True)
        if check and (survivors or left):
            raise RuntimeError(f"the Grid Engine cell left processes running: {left}")

    def __enter__(self) -> GridEngineCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(check=exc[0] is None)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the daemons' messages files and start logs."""
        texts = []
        spool = self.root / CELL / "spool"
        paths = [spool / "qmaster" / "messages", *(spool / h / "messages" for h in self._hosts())]
        if self.hosts is not None:
            paths += [self.hosts.state / h / "start.log" for h in self.names]
        for path in paths:
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                texts += [f"{path.relative_to(path.parents[1])}: {t}" for t in tail]
        return "\n".join(texts)

    def _hosts(self) -> list[str]:
        return self.names if self.hosts is not None else []

    # --- jobs ------------------------------------------------------------------------------

    def env(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """``base`` (default: this process's environment) with none of the caller's engine
        or launcher variables, this cell's ``SGE_*``, and ``extra``."""
        source = os.environ if base is None else base
        out = {k: v for k, v in source.items() if not k.startswith(_DROP_PREFIXES)}
        out = {k: v for k, v in out.items() if k not in _DROP}
        out.update(
            SGE_ROOT=str(self.root),
            SGE_CELL=CELL,
            SGE_QMASTER_PORT=str(QMASTER_PORT),
            SGE_EXECD_PORT=str(EXECD_PORT),
        )
        out.update(extra)
        return out

    def on(self, host: str, argv: Sequence[str], cwd: str | Path = ROOT) -> list[str]:
        """``argv`` run inside ``host``."""
        assert self.hosts is not None
        return self.hosts.on(host, argv, cwd=str(cwd))

    def client(
        self, name: str, *args: str, timeout: float = 30, host: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """A Grid Engine client (``qstat``, ``qconf``, ``qdel``, ...) run in ``host``
        (default h1) to its end, stdout and stderr merged."""
        return self.run([f"/usr/bin/{name}", *args], host=host, timeout=timeout)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        host: str = "",
        cwd: str | Path = ROOT,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` in ``host`` (default h1) in its own session, against this cell; past
        ``timeout`` its process group is killed (by id) and :class:`TimeoutError` raised."""
        argv = self.on(host or self.names[0], argv, cwd=cwd)
        return run_in_session(argv, env=self.env(env), cwd=cwd, timeout=timeout)

    def submit(
        self, script: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None
    ) -> tuple[int, Path]:
        """Submit ``script`` (its text) with ``qsub ARGS`` from h1, its environment exported
        (``-V``: ``env`` over this cell's), output and errors merged; (job id, output file).

        The script runs in this repository's root (``-wd``) with ``/bin/sh`` unless
        ``-S`` says otherwise."""
        handle, path = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.dir)
        with os.fdopen(handle, "w") as out:
            out.write(script)
        os.chmod(path, 0o755)
        output = Path(f"{path}.out")
        argv = ["/usr/bin/qsub", "-terse", "-V", "-wd", str(ROOT), "-j", "y", "-o", str(output)]
        done = self.run([*argv, *args, path], env=env, timeout=30)
        first = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
        if done.returncode != 0 or not first or not first[0].isdigit():
            raise RuntimeError(f"qsub failed ({done.returncode}):\n{done.stdout}")
        return int(first[0]), output

    def job_end(self, job_id: int) -> JobEnd | None:
        """The job's end from the accounting file, None while it has not ended.

        The record of the job itself (``pe_taskid`` NONE): each ``qrsh -inherit`` task of a
        parallel job writes one of its own when it ends, which ``qacct -j`` would also show."""
        with contextlib.suppress(OSError):
            for line in (self.root / CELL / "common" / "accounting").read_text().splitlines():
                fields = line.split(":")
                if len(fields) > 41 and fields[5] == str(job_id) and fields[41] == "NONE":
                    named = dict(zip(ACCOUNTING, fields, strict=False))
                    return JobEnd(job_id, int(fields[12]), fields[11], named)
        return None

    def wait_job(self, job_id: int, *, timeout: float = 120, poll: float = 0.1) -> JobEnd:
        """Wait until the job has ended (its accounting record is written)."""
        deadline = time.monotonic() + timeout
        while True:
            end = self.job_end(job_id)
            if end is not None:
                return end
            if time.monotonic() > deadline:
                self.client("qdel", str(job_id))
                raise TimeoutError(f"Grid Engine job {job_id} did not end within {timeout} s")
            time.sleep(poll)

    def qsub(
        self,
        script: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
    ) -> tuple[int, str, JobEnd]:
        """Submit ``script`` and wait for its end; (job id, its output's text, its end)."""
        job_id, output = self.submit(script, args, env=env)
        end = self.wait_job(job_id, timeout=timeout)
        text = output.read_text(errors="replace") if output.exists() else ""
        return job_id, text, end

    def jobs(self) -> list[str]:
        """``JOBID STATE`` of every job the qmaster still lists."""
        done = self.client("qstat", "-u", "*")
        rows = [line.split() for line in done.stdout.splitlines()[2:] if line.strip()]
        return [f"{row[0]} {row[4]}" for row in rows if len(row) > 4]

    def leftovers(self) -> dict[str, list[str]]:
        """Processes in the hosts besides the harness's (sshd, the daemons): shepherds, jobs."""
        assert self.hosts is not None
        return self.hosts.leftovers()

    def wait_clean(self, within: float = 15.0) -> list[str]:
        """Wait until no job is listed and no process of a job is left on any host; return
        what still is (if anything)."""
        deadline = time.monotonic() + within
        while True:
            reap_children()
            left = self.leftovers()
            busy = [*self.jobs(), *(f"{h}: {p[:120]}" for h, ps in left.items() for p in ps)]
            if not busy or time.monotonic() > deadline:
                return busy
            time.sleep(0.1)


@contextlib.contextmanager
def cluster(hosts: int = 2) -> Iterator[GridEngineCluster]:
    """A running cell for the duration of the block, stopped and checked afterwards."""
    with GridEngineCluster(hosts) as made:
        yield made


def main(argv: list[str]) -> int:
    """``check [--start]``: can this machine run the Grid Engine tier? ``up``: a cell until Ctrl-C."""
    if argv[:1] == ["check"]:
        reason = unavailable()
        if reason is None and argv[1:] == ["--start"]:
            try:
                with cluster() as made:
                    took, names = made.started_s, ", ".join(made.names)
                print(
                    f"Grid Engine tier: runs (a cell on {names} started in {took:.2f} s and stopped)"
                )
                return 0
            except RuntimeError as error:
                reason = f"a test cell did not start: {error}"
        if reason is None:
            print("Grid Engine tier: runs (gridengine installed, root: a test cell can be made)")
            return 0
        print(f"Grid Engine tier: skipped: {reason}")
        return 1
    if argv[:1] == ["up"]:
        from tests.support.processes import become_subreaper

        become_subreaper()

        def interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt  # SIGTERM too (a background job ignores SIGINT)

        signal.signal(signal.SIGTERM, interrupt)
        signal.signal(signal.SIGINT, interrupt)
        with cluster() as made:
            env = made.env({})
            print(f"cell up on {', '.join(made.names)} in {made.started_s:.2f} s")
            print("use:  " + " ".join(made.on(made.names[0], ["bash"])))
            print("with: " + " ".join(f"{k}={v}" for k, v in env.items()))
            print("daemons:", " ".join(str(p.pid) for p in made.daemons.values()))
            print("Ctrl-C or SIGTERM stops the cell.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(1.0)
                    reap_children()
        return 0
    print("usage: python -m tests.support.gridengine_cluster check [--start] | up", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
