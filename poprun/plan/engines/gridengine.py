"""A Grid Engine job (SGE, Son of Grid Engine, Altair/Univa) as an allocation (pure).

A parallel job (``qsub -pe NAME N``) has ``JOB_ID`` and ``$PE_HOSTFILE``: a line per host and
queue, ``host slots queue processors``; a host on two queues has their slots added. Debian's
Open MPI integrates Grid Engine itself: with ``SGE_ROOT``, ``ARC``, ``PE_HOSTFILE`` and
``JOB_ID`` set, mpirun reads the same allocation and starts its daemons with
``$SGE_ROOT/bin/$ARC/qrsh -inherit``, inside the scheduler's control and accounting. Setting
``plm_rsh_agent`` switches that path off (Open MPI takes a user's agent first), so poprun
sets no agent here and runs no ssh check. Where ``SGE_ROOT`` or ``ARC`` is missing, qrsh is
switched off (``plm_rsh_disable_qrsh``) or the user named an agent, mpirun uses that or ssh,
and so does the check.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from poprun.errors import PoprunError
from poprun.plan.engines.allocation import SSH, Allocation, Launcher, mca_value
from poprun.plan.engines.kubernetes import Read

JOB_ID = "JOB_ID"
HOST_FILE = "PE_HOSTFILE"
#: The master node's own: its host file, its queue, its scratch directory (each node's
#: tasks get theirs from ``qrsh -inherit``).
NODE_ONLY = frozenset({HOST_FILE, "QUEUE", "TMPDIR", "TMP", "SGE_STDOUT_PATH", "SGE_STDERR_PATH"})
_QRSH_OFF = "OMPI_MCA_plm_rsh_disable_qrsh"


def read_gridengine(
    environ: Mapping[str, str], read: Read, global_args: Sequence[str] = ()
) -> Allocation | None:
    """The Grid Engine parallel job poprun runs in, or None outside one."""
    path = environ.get(HOST_FILE, "").strip()
    job = environ.get(JOB_ID, "").strip()
    if not path or not job:
        return None
    merged: dict[str, int] = {}
    for number, line in enumerate(read(HOST_FILE, path).splitlines(), 1):
        words = line.split()
        if not words:
            continue
        if len(words) < 2 or not (words[1].isascii() and words[1].isdigit()) or int(words[1]) < 1:
            raise PoprunError(
                HOST_FILE, f"{path}:{number}", f"{line.strip()!r} is not 'host slots queue "
                "processors'", "run poprun inside the job Grid Engine gave you (qsub -pe), unchanged",
            )  # fmt: skip
        merged[words[0]] = merged.get(words[0], 0) + int(words[1])
    if not merged:
        raise PoprunError(HOST_FILE, path, "lists no hosts", "run poprun inside a qsub -pe job")
    return Allocation(
        "Grid Engine", job, tuple(merged), tuple(merged.values()), HOST_FILE, path,
        launcher=_launcher(environ, global_args), local_only=NODE_ONLY,
        more="ask Grid Engine for more slots (qsub -pe NAME N)",
    )  # fmt: skip


def _launcher(environ: Mapping[str, str], global_args: Sequence[str]) -> Launcher:
    """Open MPI's own ``qrsh -inherit`` where it takes that path, else ssh (a launch agent
    the user chose comes first in Open MPI, and switches it off)."""
    root, arch = environ.get("SGE_ROOT", ""), environ.get("ARC", "")
    given = mca_value(global_args, "plm_rsh_disable_qrsh") or environ.get(_QRSH_OFF, "")
    off = given.strip().lower() in ("1", "true", "yes", "t", "y")
    chosen = environ.get("OMPI_MCA_plm_rsh_agent") or mca_value(global_args, "plm_rsh_agent")
    if not root or not arch or off or chosen:
        return SSH
    qrsh = os.path.join(root, "bin", arch, "qrsh")
    # qrsh -inherit -V carries mpirun's environment to the other hosts; Grid Engine sets
    # TMPDIR, TMP and HOSTNAME there again, but not the master's PE_HOSTFILE
    return Launcher(
        "qrsh -inherit", ssh=False, oversubscribe=True, lingers=True,
        probe=(qrsh, "-inherit", "{host}"), unset_remote=(HOST_FILE,),
    )  # fmt: skip
