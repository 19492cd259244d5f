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
from poprun.plan.engines.allocation import Launcher

#: Set in every Slurm job (the second is the older spelling, still exported).
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID")
NODE_LIST_VARIABLES = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
JOB_CPUS_PER_NODE = "SLURM_JOB_CPUS_PER_NODE"
CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"
#: Set inside an ``srun`` step (not in ``salloc`` nor in an ``sbatch`` script).
STEP_ID_VARIABLES = ("SLURM_STEP_ID", "SLURM_STEPID")
#: Inside an ``srun`` step: the ``srun`` that starts Open MPI's daemons shares its CPUs. With
#: ``--min-hosts`` too: after a lost node, the job launched again on the rest would wait for
#: the lost node's step to free its resources (Slurm frees them only once it declares the
#: node down).
STEP_MCA: tuple[str, str] = ("plm_slurm_args", "--overlap")
#: Open MPI's own count of a node's slots is the tasks of the job or step it runs in
#: (``SLURM_TASKS_PER_NODE`` over ``SLURM_CPUS_PER_TASK``), and it gives a node no more
#: instances than that, whatever ``-H n1:2,n2:2`` says, scattering the rest: inside an
#: ``srun -N1 -n1`` step it counted one slot on the first node and none on the second and
#: started three of four instances on the first, where the plan had two. Counted from the
#: job's CPUs instead (``SLURM_JOB_CPUS_PER_NODE``), never fewer than the tasks poprun plans
#: on unless the job overcommits (``-O``), the slots hold the plan and the ``-H`` counts rule.
RAS_MCA: tuple[str, str] = ("ras_slurm_use_entire_allocation", "1")
#: A membership probe: a one-task step of the job on the node, beside the job's own steps.
_STEP_PROBE = ("srun", "--overlap", "--nodes=1", "--ntasks=1", "--quiet", "--nodelist={host}")
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
    def engine(self) -> str:
        return "Slurm"

    @property
    def slot_word(self) -> str:
        return "task"

    @property
    def ask_for_more(self) -> str:
        return "ask Slurm for more tasks (--ntasks, --ntasks-per-node)"

    @property
    def announce(self) -> str:
        return ""

    @property
    def local_only(self) -> frozenset[str]:
        """None beyond ``SLURM_*``, which is never forwarded: each node's instances get
        Slurm's variables from the ``srun`` step that started Open MPI's daemon there."""
        return frozenset()

    @property
    def launcher(self) -> Launcher:
        """mpirun starts its daemons through ``srun`` (Open MPI's plm slurm): no ssh."""
        return Launcher(
            "srun",
            ssh=False,
            mca=(RAS_MCA, STEP_MCA) if self.in_step else (RAS_MCA,),
            elastic_mca=(STEP_MCA,),
            oversubscribe=True,
            lingers=True,
            probe=(*_STEP_PROBE[:1], f"--jobid={self.job_id}", *_STEP_PROBE[1:]),
        )

    @property
    def total_tasks(self) -> int:
        return sum(self.tasks)

    @property
    def slotted(self) -> bool:
        return True

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
    if not (per_task_text.isascii() and per_task_text.isdigit()) or int(per_task_text) < 1:
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


def node_addresses(text: str) -> dict[str, str]:
    """``{node: address}`` from ``scontrol show node -o`` (one ``NodeName=... NodeAddr=...``
    line a node): where Slurm itself reaches each node, when its name does not resolve."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            out[fields["NodeName"]] = fields["NodeAddr"]
    return out
