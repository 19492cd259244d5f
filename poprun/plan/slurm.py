"""A Slurm job's allocation as a host source (pure: an environment in, hosts and counts out).

Inside a Slurm job (``SLURM_JOB_ID`` set: ``salloc``, an ``sbatch`` script, or an ``srun``
step), poprun given no ``-H``/``--host-file`` runs on the job's nodes, as many instances as
the job has tasks, placed the way Slurm laid the tasks out. What it reads:

* ``SLURM_JOB_NODELIST`` (older Slurm: ``SLURM_NODELIST``): the job's nodes, compressed
  (``n[1-3,7],gpu-[01-04]``), expanded by python-hostlist, the library Slurm's own users
  keep for this. Inside an ``srun`` step ``SLURM_STEP_NODELIST`` names the step's nodes
  only: poprun started by ``srun -N1 -n1`` still plans for the whole job.
* The tasks per node: ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: two tasks on each of three
  nodes, then one). ``srun`` overwrites it with the *step's* layout (``1`` under
  ``srun -N1 -n1``), so inside a step (``SLURM_STEP_ID`` set) poprun counts the job's CPUs
  per node divided by the CPUs per task (``SLURM_JOB_CPUS_PER_NODE`` /
  ``SLURM_CPUS_PER_TASK``), the count Open MPI itself reads there.

Placement fills the nodes in order, each up to its tasks (Open MPI's ``--map-by slot``):
with ``2(x2)`` and 4 instances, instances 0-1 run on the first node, 2-3 on the second;
asked for fewer instances than tasks, the last nodes may get none. More instances than the
job has tasks, or hosts named with ``-H`` that are not in the job, are usage errors naming
both sides; nothing is launched.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from poprun.errors import PoprunError

#: Set in every Slurm job (the second is the older spelling, still exported).
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID")
NODE_LIST_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
JOB_CPUS_PER_NODE = "SLURM_JOB_CPUS_PER_NODE"
CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"
#: Set inside an ``srun`` step (not in ``salloc`` nor in an ``sbatch`` script).
STEP_ID_VARIABLES = ("SLURM_STEP_ID", "SLURM_STEPID")
#: The most nodes one allocation may list: more is a corrupt variable, not a cluster.
MAX_NODES = 65536
_COUNTS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


class SlurmAllocation(NamedTuple):
    """What poprun read of the job it runs in."""

    job_id: str
    #: The node list as Slurm wrote it, and which variable it came from.
    node_list: str
    node_variable: str
    nodes: tuple[str, ...]
    #: The tasks (slots) of each node, as written and where from, and expanded per node.
    tasks_text: str
    tasks_variable: str
    tasks: tuple[int, ...]
    #: Whether poprun runs inside an ``srun`` step (its launch then needs ``--overlap``).
    in_step: bool = False

    @property
    def total_tasks(self) -> int:
        return sum(self.tasks)

    def slots(self, node: str) -> int:
        """The tasks the job has on ``node`` (0 when it is not in the job)."""
        return dict(zip(self.nodes, self.tasks, strict=True)).get(node, 0)

    def describe(self) -> str:
        """``Slurm job 17 (nodes n[1-2], 2(x2) tasks per node)``: for errors and titles."""
        return (
            f"Slurm job {self.job_id} (nodes {self.node_list}, "
            f"{self.tasks_text} tasks per node, {self.total_tasks} in all)"
        )

    def render(self) -> str:
        """The allocation as ``--print-topology`` shows it: what was read, from where."""
        layout = ", ".join(f"{n}:{t}" for n, t in zip(self.nodes, self.tasks, strict=True))
        step = "; poprun runs in an srun step, planned for the whole job" if self.in_step else ""
        return (
            f"Slurm allocation: job {self.job_id}, nodes {self.node_list} ({self.node_variable}), "
            f"tasks per node {self.tasks_text} ({self.tasks_variable}): {layout}{step}"
        )


def _first(environ: Mapping[str, str], names: Sequence[str]) -> tuple[str, str] | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


def parse_node_list(text: str, variable: str = NODE_LIST_VARIABLES[0]) -> tuple[str, ...]:
    """Expand a Slurm node list (``n[1-3,7],gpu-[01-04]``) with python-hostlist."""
    import hostlist

    fix = "run poprun inside the job Slurm gave you (salloc, sbatch, srun), or unset it"
    try:
        nodes = [str(n) for n in hostlist.expand_hostlist(text)]
    except (hostlist.BadHostlist, ValueError) as error:
        raise PoprunError(variable, text, f"is not a Slurm node list ({error})", fix) from None
    if not nodes:
        raise PoprunError(variable, text, "lists no nodes", fix)
    if len(nodes) > MAX_NODES:
        raise PoprunError(variable, text, f"lists more than {MAX_NODES} nodes", fix)
    return tuple(nodes)


def parse_counts(text: str, variable: str = TASKS_PER_NODE) -> tuple[int, ...]:
    """Expand Slurm's per-node counts: ``2(x3),1`` → ``(2, 2, 2, 1)``.

    The grammar is small (``N`` or ``N(xR)``, comma-separated) and python-hostlist's reader
    of it accepts a zero repeat, so it is read here, each part checked.
    """
    fix = "run poprun inside the job Slurm gave you (salloc, sbatch, srun), or unset it"
    counts: list[int] = []
    for part in text.split(","):
        match = _COUNTS.match(part.strip())
        if match is None:
            raise PoprunError(variable, text, f"part {part!r} is not N or N(xR)", fix)
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        if repeat < 1:
            raise PoprunError(variable, text, f"part {part!r} repeats a count 0 times", fix)
        if len(counts) + repeat > MAX_NODES:
            raise PoprunError(variable, text, f"describes more than {MAX_NODES} nodes", fix)
        counts.extend([count] * repeat)
    return tuple(counts)


def _tasks(environ: Mapping[str, str], in_step: bool) -> tuple[str, str, tuple[int, ...]]:
    """(text, variable, counts) of the job's tasks per node."""
    if not in_step and environ.get(TASKS_PER_NODE, "").strip():
        text = environ[TASKS_PER_NODE].strip()
        return text, TASKS_PER_NODE, parse_counts(text, TASKS_PER_NODE)
    text = environ.get(JOB_CPUS_PER_NODE, "").strip()
    if not text:
        wanted = TASKS_PER_NODE if not in_step else JOB_CPUS_PER_NODE
        raise PoprunError(
            wanted,
            None,
            "is not set, so the job's tasks per node are unknown",
            "run poprun inside the job Slurm gave you (salloc, sbatch, srun), or name the hosts "
            "with -H and give --num-instances",
        )
    cpus = parse_counts(text, JOB_CPUS_PER_NODE)
    per_task_text = environ.get(CPUS_PER_TASK, "1").strip() or "1"
    if not per_task_text.isdigit() or int(per_task_text) < 1:
        raise PoprunError(
            CPUS_PER_TASK, per_task_text, "is not a positive whole number", "unset it or fix it"
        )
    per_task = int(per_task_text)
    tasks = tuple(c // per_task for c in cpus)
    shown = text if per_task == 1 else f"{text} CPUs / {per_task}"
    return shown, JOB_CPUS_PER_NODE, tasks


def read_allocation(environ: Mapping[str, str]) -> SlurmAllocation | None:
    """The Slurm job poprun runs in, or None outside one; a usage error when it is garbled."""
    job = _first(environ, JOB_ID_VARIABLES)
    if job is None:
        return None
    found = _first(environ, NODE_LIST_VARIABLES)
    if found is None:
        raise PoprunError(
            job[0],
            job[1],
            f"is set but {NODE_LIST_VARIABLES[0]} is not, so the job's nodes are unknown",
            "run poprun inside the job Slurm gave you (salloc, sbatch, srun), or unset "
            f"{' and '.join(JOB_ID_VARIABLES)}",
        )
    node_variable, node_list = found
    nodes = parse_node_list(node_list, node_variable)
    in_step = _first(environ, STEP_ID_VARIABLES) is not None
    tasks_text, tasks_variable, tasks = _tasks(environ, in_step)
    if len(tasks) != len(nodes):
        raise PoprunError(
            tasks_variable,
            tasks_text,
            f"gives counts for {len(tasks)} node(s) but {node_variable}={node_list} lists "
            f"{len(nodes)}",
            "run poprun inside the job Slurm gave you (salloc, sbatch, srun), unchanged",
        )
    return SlurmAllocation(
        job_id=job[1],
        node_list=node_list,
        node_variable=node_variable,
        nodes=nodes,
        tasks_text=tasks_text,
        tasks_variable=tasks_variable,
        tasks=tasks,
        in_step=in_step,
    )


class SlurmHosts(NamedTuple):
    """The host source inside a Slurm job given no ``-H``: the job's nodes."""

    allocation: SlurmAllocation

    @property
    def option(self) -> str:
        return self.allocation.node_variable

    def hosts(self) -> tuple[str, ...]:
        return self.allocation.nodes

    def place(self, num_instances: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        return place(self.allocation, num_instances)


def default_instances(allocation: SlurmAllocation, num_replicas: int | None) -> int:
    """``--num-instances`` when it is not given: one instance per task of the job.

    Refuses, naming the allocation, when ``--num-replicas`` cannot be shared by that many.
    """
    tasks = allocation.total_tasks
    if tasks < 1:
        raise PoprunError(
            allocation.tasks_variable,
            allocation.tasks_text,
            f"leaves no task for an instance in {allocation.describe()}",
            "ask Slurm for tasks (--ntasks or --ntasks-per-node)",
        )
    replicas = 1 if num_replicas is None else num_replicas
    if replicas < tasks or replicas % tasks:
        raise PoprunError(
            "--num-replicas",
            replicas,
            f"cannot be shared by one instance per task of {allocation.describe()} (the "
            "default): every instance needs the same whole number of replicas",
            f"use a multiple of {tasks} replicas, or give --num-instances (a divisor of "
            f"{replicas}, at most {tasks})",
        )
    return tasks


def place(
    allocation: SlurmAllocation, num_instances: int
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(hosts, instances per host): the job's nodes filled in order up to their tasks.

    Nodes left without an instance are left out.
    """
    if num_instances > allocation.total_tasks:
        raise PoprunError(
            "--num-instances",
            num_instances,
            f"is more than the {allocation.total_tasks} tasks of {allocation.describe()}",
            f"use --num-instances {allocation.total_tasks} or fewer (or leave it out: one "
            "instance per task), or ask Slurm for more tasks (--ntasks, --ntasks-per-node)",
        )
    hosts: list[str] = []
    counts: list[int] = []
    left = num_instances
    for node, tasks in zip(allocation.nodes, allocation.tasks, strict=True):
        take = min(tasks, left)
        if take:
            hosts.append(node)
            counts.append(take)
        left -= take
    return tuple(hosts), tuple(counts)


def check_hosts(
    allocation: SlurmAllocation, hosts: Sequence[str], option: str, num_instances: int
) -> None:
    """Hosts named with ``-H``/``--host-file`` inside a job: each in the job, with room for
    its share of the instances (poprun divides them evenly over the hosts it is given)."""
    for host in hosts:
        if host not in allocation.nodes:
            raise PoprunError(
                option,
                host,
                f"is not a node of {allocation.describe()}",
                f"name nodes of the job ({', '.join(allocation.nodes[:8])}"
                f"{', ...' if len(allocation.nodes) > 8 else ''}), or leave out {option} to "
                "run on the whole allocation",
            )
    per_host = num_instances // max(len(hosts), 1)
    for host in hosts:
        if per_host > allocation.slots(host):
            raise PoprunError(
                "--num-instances",
                num_instances,
                f"puts {per_host} instances on {host}, which has {allocation.slots(host)} "
                f"task(s) in {allocation.describe()}",
                f"use fewer instances, or name more of the job's nodes with {option}, or ask "
                "Slurm for more tasks per node (--ntasks-per-node)",
            )


def node_addresses(text: str) -> dict[str, str]:
    """``{node: address}`` from ``scontrol show node -o`` (one ``NodeName=... NodeAddr=...``
    line a node): where Slurm itself reaches each node, when its name does not resolve."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            out[fields["NodeName"]] = fields["NodeAddr"]
    return out
