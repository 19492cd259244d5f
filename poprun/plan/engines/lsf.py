"""An IBM Spectrum LSF job as an allocation (pure).

An LSF job has ``LSB_JOBID`` and its slots three ways: ``$LSB_DJOB_HOSTFILE``, a file of one
line per slot; ``LSB_MCPU_HOSTS``, ``host1 4 host2 2``; and ``LSB_HOSTS``, a host per slot
(truncated in large jobs), read in that order. The first host is where the job's script
runs. LSF's ``blaunch`` is "a drop-in replacement for rsh and ssh" on the job's hosts: where
it is found (``$LSF_BINDIR/blaunch``, else on ``PATH``) Open MPI's daemons start through it,
inside LSF's control and accounting, and there is no ssh check; else over ssh. Debian's Open
MPI has no LSF support of its own, so mpirun reads none of this.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from poprun.errors import PoprunError
from poprun.plan.engines import hostfile
from poprun.plan.engines.allocation import SSH, Allocation, Launcher
from poprun.plan.engines.kubernetes import Read

JOB_ID = "LSB_JOBID"
HOST_FILE = "LSB_DJOB_HOSTFILE"
MCPU_HOSTS = "LSB_MCPU_HOSTS"
HOSTS = "LSB_HOSTS"
#: The job's files and this node's bindings: never forwarded.
NODE_ONLY = frozenset(
    {
        HOST_FILE, "LSB_DJOB_RANKFILE", "LSB_AFFINITY_HOSTFILE", "LSB_BIND_CPU_LIST",
        "LSB_BIND_MEM_LIST", "LSB_DJOB_NUMPROC", "LS_EXEC_T", "LSB_CHKFILENAME",
    }
)  # fmt: skip

#: ``name -> path or None``: finds a program (``shutil.which`` on the job's ``PATH``).
Which = Callable[[str], "str | None"]


def read_lsf(environ: Mapping[str, str], read: Read, which: Which) -> Allocation | None:
    """The LSF job poprun runs in, or None outside one."""
    job = environ.get(JOB_ID, "").strip()
    if not job:
        return None
    variable, hosts, slots, path = _slots(environ, read, job)
    bindir = environ.get("LSF_BINDIR", "").strip()
    blaunch = os.path.join(bindir, "blaunch") if bindir else None
    if blaunch is None or which(blaunch) is None:
        blaunch = which("blaunch")
    launcher = SSH
    said = f"poprun: LSF job {job}: Open MPI's daemons start through "
    said += "ssh (no blaunch in $LSF_BINDIR or on PATH)"
    if blaunch is not None:
        launcher = Launcher(
            "blaunch", ssh=False, agent=blaunch, lingers=True, probe=(blaunch, "{host}")
        )
        said = f"poprun: LSF job {job}: Open MPI's daemons start through {blaunch}"
    return Allocation(
        "LSF", job, hosts, slots, variable, path, launcher=launcher, local_only=NODE_ONLY,
        more="ask LSF for more slots (bsub -n)", announce=said,
    )  # fmt: skip


def _slots(
    environ: Mapping[str, str], read: Read, job: str
) -> tuple[str, tuple[str, ...], tuple[int, ...], str]:
    """(variable, hosts, slots, file) from the first of LSF's three descriptions."""
    path = environ.get(HOST_FILE, "").strip()
    if path:
        listed = hostfile.parse(read(HOST_FILE, path), HOST_FILE, path)
        return HOST_FILE, listed.hosts, listed.slots, path
    text = environ.get(MCPU_HOSTS, "").strip()
    if text:
        words = text.split()
        pairs = list(zip(words[::2], words[1::2], strict=False))
        if len(words) % 2 or not all(n.isascii() and n.isdigit() and int(n) > 0 for _, n in pairs):
            raise PoprunError(
                MCPU_HOSTS, text, "is not 'host slots host slots ...'",
                "run poprun inside the job LSF gave you (bsub), unchanged",
            )  # fmt: skip
        merged: dict[str, int] = {}
        for host, n in pairs:
            merged[host] = merged.get(host, 0) + int(n)
        return MCPU_HOSTS, tuple(merged), tuple(merged.values()), ""
    text = environ.get(HOSTS, "").strip()
    if text:
        listed = hostfile.parse("\n".join(text.split()), HOSTS, HOSTS)
        return HOSTS, listed.hosts, listed.slots, ""
    raise PoprunError(
        JOB_ID, job, f"is set but none of {HOST_FILE}, {MCPU_HOSTS}, {HOSTS} is",
        f"run poprun inside the job LSF gave you (bsub), or unset {JOB_ID}",
    )  # fmt: skip
