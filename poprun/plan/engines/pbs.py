"""A PBS Pro, OpenPBS or Torque job as an allocation (pure).

A PBS job has ``PBS_JOBID`` (and ``PBS_ENVIRONMENT``: ``PBS_BATCH`` or ``PBS_INTERACTIVE``)
and ``$PBS_NODEFILE``: one line per slot (per MPI process the job asked for), so a node
named on four lines has four slots, in the order its lines first appear. Debian's Open MPI
is built without PBS's TM interface: mpirun sees no allocation and starts its daemons over
ssh, the job's nodes given as ``-H``, which poprun reads from the file. (A TM-enabled Open
MPI reads the same allocation itself; ``-H`` with the file's names agrees with it.)
"""

from __future__ import annotations

from collections.abc import Mapping

from poprun.errors import PoprunError
from poprun.plan.engines import hostfile
from poprun.plan.engines.allocation import Allocation
from poprun.plan.engines.kubernetes import Read

JOB_ID = "PBS_JOBID"
ENVIRONMENT = "PBS_ENVIRONMENT"
NODE_FILE = "PBS_NODEFILE"
#: Per node (the mother superior's file and numbers, the MOM's port): never forwarded.
NODE_ONLY = frozenset({NODE_FILE, "PBS_NODENUM", "PBS_TASKNUM", "PBS_VNODENUM", "PBS_MOMPORT"})


def read_pbs(environ: Mapping[str, str], read: Read) -> Allocation | None:
    """The PBS job poprun runs in, or None outside one."""
    job = environ.get(JOB_ID, "").strip()
    if not job and not environ.get(ENVIRONMENT, "").strip():
        return None
    path = environ.get(NODE_FILE, "").strip()
    if not path:
        raise PoprunError(
            JOB_ID if job else ENVIRONMENT,
            job or environ.get(ENVIRONMENT),
            f"is set but {NODE_FILE} is not, so the job's nodes are unknown",
            f"run poprun inside the job PBS gave you (qsub), or unset {JOB_ID} and {ENVIRONMENT}",
        )
    listed = hostfile.parse(read(NODE_FILE, path), NODE_FILE, path)
    return Allocation(
        "PBS", job, listed.hosts, listed.slots, NODE_FILE, path, local_only=NODE_ONLY,
        more="ask PBS for more (qsub -l select=N:ncpus=C:mpiprocs=P)",
    )  # fmt: skip
