"""What a cluster engine gives a job, in one shape for every engine (pure).

Each engine (:mod:`poprun.plan.slurm`, and the readers in this package) turns its environment
and files into an *allocation*: the job's nodes in order, the slots (tasks) of each, where
that came from, and how mpirun starts its daemons on the other nodes (a :class:`Launcher`).
The rest of poprun reads allocations only through the :class:`JobAllocation` protocol:
:func:`place` fills the nodes in order up to their slots (Open MPI's ``--map-by slot``),
:func:`check_hosts` checks hosts the user named inside the job, :func:`default_instances`
is one instance per slot, and ``plan/mpirun.py`` and the ssh check take the launcher's data
as they are. An engine is one more reader, not a branch anywhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from poprun.errors import PoprunError


class Launcher(NamedTuple):
    """How mpirun starts Open MPI's daemons on the other hosts: data for the argv and checks.

    ``name`` is shown (``ssh``, ``srun``, ``qrsh -inherit``, ``blaunch``). ``ssh``: the ssh
    check applies and its connections may become mpirun's agent; ``False`` where the engine
    starts the daemons itself, under its control and accounting. ``agent``: a launch agent
    poprun names (``--mca plm_rsh_agent``); None keeps Open MPI's own choice. ``mca``: more
    ``--mca`` pairs, and ``elastic_mca`` those added with ``--min-hosts``. ``oversubscribe``:
    mpirun reads the engine's own slot counts, so ``-H host:k`` does not set them. ``lingers``:
    the engine's launch processes outlive mpirun by a moment (not the job's leftovers).
    ``probe``: the command that runs ``true`` on a node for the membership's probes (empty:
    ssh through the agent). ``unset_remote``: variables the engine's start carries from
    mpirun to the other hosts' instances although they describe this host only (Grid
    Engine's ``qrsh -inherit -V`` exports mpirun's whole environment); the remote wrapper
    unsets them.
    """

    name: str = "ssh"
    ssh: bool = True
    agent: str | None = None
    mca: tuple[tuple[str, str], ...] = ()
    elastic_mca: tuple[tuple[str, str], ...] = ()
    oversubscribe: bool = False
    lingers: bool = False
    probe: tuple[str, ...] = ()
    unset_remote: tuple[str, ...] = ()


SSH = Launcher()


class JobAllocation(Protocol):
    """What poprun reads of the job an engine gave it."""

    @property
    def engine(self) -> str: ...
    @property
    def job_id(self) -> str: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...
    @property
    def tasks(self) -> tuple[int, ...]: ...
    #: Where the nodes came from (a variable's name), and the slots (variable, as written).
    @property
    def node_variable(self) -> str: ...
    @property
    def tasks_variable(self) -> str: ...
    @property
    def tasks_text(self) -> str: ...
    @property
    def launcher(self) -> Launcher: ...
    #: Variables that describe this node only: never forwarded to the others.
    @property
    def local_only(self) -> frozenset[str]: ...
    #: What the engine calls a slot ("task" for Slurm), and how to ask it for more.
    @property
    def slot_word(self) -> str: ...
    @property
    def ask_for_more(self) -> str: ...
    #: A line to print at launch ("" for none): how daemons start, where the engine leaves a
    #: choice (LSF: ``blaunch`` or ssh).
    @property
    def announce(self) -> str: ...
    @property
    def total_tasks(self) -> int: ...
    #: Whether the engine counts slots per node (False: it lists hosts only, as Volcano's
    #: ``MPI_HOST``, and the instances are shared evenly).
    @property
    def slotted(self) -> bool: ...
    def slots(self, node: str) -> int: ...
    def describe(self) -> str: ...
    def render(self) -> str: ...


class Allocation(NamedTuple):
    """A job as an engine other than Slurm describes it (its reader fills one)."""

    engine: str
    job_id: str
    nodes: tuple[str, ...]
    tasks: tuple[int, ...]
    #: The variable that named the hosts (or their file), and that file, if any.
    node_variable: str
    path: str = ""
    launcher: Launcher = SSH
    local_only: frozenset[str] = frozenset()
    #: Whether ``tasks`` are the engine's slot counts (False: it lists hosts only, and the
    #: instances are shared evenly, as for ``-H``).
    slotted: bool = True
    #: How to get more slots (default: ask the engine).
    more: str = ""
    announce: str = ""

    @property
    def tasks_variable(self) -> str:
        return self.node_variable

    @property
    def slot_word(self) -> str:
        return "slot"

    @property
    def ask_for_more(self) -> str:
        return self.more or f"ask {self.engine} for more slots"

    @property
    def tasks_text(self) -> str:
        return ",".join(map(str, self.tasks))

    @property
    def total_tasks(self) -> int:
        return sum(self.tasks)

    def slots(self, node: str) -> int:
        return dict(zip(self.nodes, self.tasks, strict=True)).get(node, 0)

    def where(self) -> str:
        """``PE_HOSTFILE=/var/spool/.../pe_hostfile`` or ``MPI_HOST``."""
        return f"{self.node_variable}={self.path}" if self.path else self.node_variable

    def describe(self) -> str:
        """``Grid Engine job 17 (2 hosts, 4 slots, PE_HOSTFILE=...)``: for errors and titles."""
        job = f" job {self.job_id}" if self.job_id else ""
        slots = f", {self.total_tasks} slots" if self.slotted else ""
        return f"{self.engine}{job} ({len(self.nodes)} hosts{slots}, {self.where()})"

    def render(self) -> str:
        """The allocation as ``--print-topology`` shows it: what was read, from where, how
        daemons start."""
        if self.slotted:
            layout = ", ".join(f"{n}:{t}" for n, t in zip(self.nodes, self.tasks, strict=True))
        else:
            layout = ", ".join(self.nodes)
        job = f" job {self.job_id}" if self.job_id else ""
        return (
            f"{self.engine}{job}: hosts from {self.where()}: {layout}; Open MPI's daemons start "
            f"through {self.launcher.name}"
        )


def place(
    allocation: JobAllocation,
    num_instances: int,
    *,
    oversubscribe: bool = False,
    host_file: bool = False,
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(hosts, instances per host): the job's nodes filled in order up to their slots.

    Nodes left without an instance are left out. More instances than slots is a usage error
    naming the allocation, unless the user asked for oversubscription (``host_file``: a
    ``--host-file``'s slots, which ``--oversubscribe`` may exceed; an engine's job may not
    be): then each further round fills the nodes by their slots again.
    """
    total, word = allocation.total_tasks, allocation.slot_word
    if num_instances > total and not (oversubscribe and total > 0):
        raise PoprunError(
            "--num-instances",
            num_instances,
            f"is more than the {total} {word}s of {allocation.describe()}",
            f"use --num-instances {total} or fewer (or leave it out: one instance per {word}), "
            f"or {allocation.ask_for_more}"
            + (", or pass --mpi-global-args=--oversubscribe" if host_file else ""),
        )
    counts = [0] * len(allocation.nodes)
    left = num_instances
    while left:
        for i, slots in enumerate(allocation.tasks):
            take = min(slots, left)
            counts[i] += take
            left -= take
    kept = [(node, n) for node, n in zip(allocation.nodes, counts, strict=True) if n]
    return tuple(node for node, _ in kept), tuple(n for _, n in kept)


def default_instances(allocation: JobAllocation, num_replicas: int | None) -> int:
    """``--num-instances`` when it is not given: one instance per slot of the job.

    Refuses, naming the allocation, when ``--num-replicas`` cannot be shared by that many.
    """
    tasks, word = allocation.total_tasks, allocation.slot_word
    if tasks < 1:
        raise PoprunError(
            allocation.tasks_variable,
            allocation.tasks_text,
            f"leaves no {word} for an instance in {allocation.describe()}",
            allocation.ask_for_more,
        )
    replicas = 1 if num_replicas is None else num_replicas
    if replicas < tasks or replicas % tasks:
        raise PoprunError(
            "--num-replicas",
            replicas,
            f"cannot be shared by one instance per {word} of {allocation.describe()} (the "
            "default): every instance needs the same whole number of replicas",
            f"use a multiple of {tasks} replicas, or give --num-instances (a divisor of "
            f"{replicas}, at most {tasks})",
        )
    return tasks


def check_hosts(
    allocation: JobAllocation,
    hosts: Sequence[str],
    counts: Sequence[int],
    option: str,
    num_instances: int,
) -> None:
    """Hosts named with ``-H``/``--host-file`` inside a job, placed ``counts`` instances
    each: every one a node of the job, with the slots for its instances there (where the
    engine counts slots)."""
    slots = dict(zip(allocation.nodes, allocation.tasks, strict=True))
    for host in hosts:
        if host not in slots:
            shown = ", ".join(allocation.nodes[:8]) + (", ..." if len(allocation.nodes) > 8 else "")
            raise PoprunError(
                option,
                host,
                f"is not a node of {allocation.describe()}",
                f"name nodes of the job ({shown}), or leave out {option} to run on the whole "
                "allocation",
            )
    if not allocation.slotted:
        return
    for host, count in zip(hosts, counts, strict=True):
        if count > slots[host]:
            raise PoprunError(
                "--num-instances",
                num_instances,
                f"puts {count} instances on {host}, which has {slots[host]} "
                f"{allocation.slot_word}(s) in {allocation.describe()}",
                f"use fewer instances, or name more of the job's nodes with {option}, or "
                f"{allocation.ask_for_more}",
            )


def mca_value(args: Sequence[str], name: str, default: str = "") -> str:
    """The last ``--mca NAME VALUE`` in ``args``, else ``default``."""
    value = default
    for i, arg in enumerate(args[:-2]):
        if arg in ("--mca", "-mca", "--gmca", "-gmca") and args[i + 1] == name:
            value = args[i + 2]
    return value
