"""Which cluster engine's job poprun runs in, read from its environment and files (pure, with
the file reads and program lookups injected).

Each engine is one reader that turns what it gives a job into an allocation
(:mod:`~poprun.plan.engines.allocation`): Slurm (:mod:`poprun.plan.slurm`), Grid Engine,
LSF, PBS, Open MPI's default host file (a Kubernetes ``MPIJob`` or ``TrainJob`` launcher's)
and Volcano's ``MPI_HOST``. :func:`detect` takes the first present in :data:`ORDER`:
Open MPI's own order where it reads the allocation itself (its Grid Engine reader outranks
its Slurm one), then the schedulers this mpirun cannot read, then the host lists a pod is
given. When several are present, one line says which was taken and why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from poprun.plan.engines.allocation import JobAllocation
from poprun.plan.engines.gridengine import read_gridengine
from poprun.plan.engines.hostfile import Expand
from poprun.plan.engines.kubernetes import (
    DEFAULT_HOSTFILE,
    OPEN_MPI_DEFAULT,
    Read,
    read_default_hostfile,
    read_volcano,
)
from poprun.plan.engines.lsf import Which, read_lsf
from poprun.plan.engines.pbs import read_pbs
from poprun.plan.slurm import read_allocation

#: Everything a reader may use: the environment, the mpirun arguments, a file reader, a
#: program finder, the ``-H`` grammar for ranges in host files.
Reader = Callable[[Mapping[str, str], Sequence[str], Read, Which, Expand], "JobAllocation | None"]


class Engine(NamedTuple):
    """One engine: its name, what shows it is present (the variables, in words), its reader."""

    name: str
    shown_by: str
    present: Callable[[Mapping[str, str], Sequence[str]], bool]
    read: Reader


def _set(environ: Mapping[str, str], name: str) -> str:
    """``name``'s value, blanks stripped ("" when unset): a blank value sets nothing."""
    return environ.get(name, "").strip()


def _default_hostfile_given(environ: Mapping[str, str], args: Sequence[str]) -> bool:
    path = _set(environ, DEFAULT_HOSTFILE)
    return bool(path and path != OPEN_MPI_DEFAULT) or "orte_default_hostfile" in args


ORDER: tuple[Engine, ...] = (
    Engine(
        "Grid Engine", "PE_HOSTFILE",
        lambda env, args: bool(_set(env, "PE_HOSTFILE") and _set(env, "JOB_ID")),
        lambda env, args, read, which, expand: read_gridengine(env, read, args),
    ),
    Engine(
        "Slurm", "SLURM_JOB_ID",
        lambda env, args: bool(_set(env, "SLURM_JOB_ID") or _set(env, "SLURM_JOBID")),
        lambda env, args, read, which, expand: read_allocation(env),
    ),
    Engine(
        "LSF", "LSB_JOBID", lambda env, args: bool(_set(env, "LSB_JOBID")),
        lambda env, args, read, which, expand: read_lsf(env, read, which),
    ),
    Engine(
        "PBS", "PBS_JOBID", lambda env, args: bool(_set(env, "PBS_JOBID") or _set(env, "PBS_ENVIRONMENT")),
        lambda env, args, read, which, expand: read_pbs(env, read),
    ),
    Engine(
        "Open MPI's default host file", DEFAULT_HOSTFILE, _default_hostfile_given,
        lambda env, args, read, which, expand: read_default_hostfile(env, read, args, expand=expand),
    ),
    Engine(
        # MPI_HOST is a common name: Volcano's only in a pod (every pod has the API's address)
        "Volcano", "MPI_HOST",
        lambda env, args: bool(_set(env, "MPI_HOST") and _set(env, "KUBERNETES_SERVICE_HOST")),
        lambda env, args, read, which, expand: read_volcano(env),
    ),
)  # fmt: skip
_WHY = (
    "poprun takes them in Open MPI's order where mpirun reads the allocation itself (Grid "
    "Engine, then Slurm), then LSF, PBS, Open MPI's default host file and Volcano's MPI_HOST"
)


def detect(
    environ: Mapping[str, str],
    global_args: Sequence[str],
    read: Read,
    which: Which,
    expand: Expand,
) -> tuple[JobAllocation | None, str]:
    """(the allocation of the first engine in :data:`ORDER` whose reader finds a job, or
    None; the line that says which was taken when others are present too, else "")."""
    present = [engine for engine in ORDER if engine.present(environ, global_args)]
    for at, engine in enumerate(present):
        allocation = engine.read(environ, global_args, read, which, expand)
        if allocation is None:
            continue  # present but no job (Open MPI's own default host file): the next
        others = present[at + 1 :]  # those before it found no job
        if not others:
            return allocation, ""
        shown = ", ".join(f"{e.name} ({e.shown_by})" for e in others)
        return allocation, (
            f"poprun: this run is inside {engine.name}'s job ({engine.shown_by}) and also has "
            f"{shown} set: using {engine.name}'s hosts; {_WHY}"
        )
    return None, ""
