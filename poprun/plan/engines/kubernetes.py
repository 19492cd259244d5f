"""Kubernetes' MPI jobs, and Open MPI's default host file, as allocations (pure).

The Kubeflow MPI Operator v2 (``MPIJob``) and the Trainer v2's MPI runtime (``TrainJob``)
give the launcher pod a host file and Open MPI's variables, nothing else:
``OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile`` (lines ``job-worker-0.job.ns.svc
slots=2``; with ``runLauncherAsWorker`` the launcher's own line first),
``OMPI_MCA_orte_set_default_slots``, ``OMPI_MCA_orte_keep_fqdn_hostnames=true`` and
``OMPI_MCA_plm_rsh_args=-o ConnectionAttempts=10``; the MPIJob adds ``K_MPI_JOB_ROLE=launcher``.
mpirun itself reads that file when it gets no hosts, so poprun does too: its hosts, with
their slots, verbatim (``-H`` is then a filter over the file, and the FQDNs are kept).
Any ``OMPI_MCA_orte_default_hostfile`` (or ``--mca orte_default_hostfile``) other than Open
MPI's own default is read the same way, outside Kubernetes too.

Volcano's MPI plugin gives the master task ``MPI_HOST``, the workers' names, comma-separated,
for ``mpiexec --host``: no slots, so the instances share them evenly, one each by default.

Daemons start over ssh (the operators mount its keys); the pod's identity (``HOSTNAME``,
``K_MPI_JOB_ROLE``) and the launcher's empty ``NVIDIA_*`` are this pod's only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from poprun.plan.engines import hostfile
from poprun.plan.engines.allocation import Allocation, mca_value

#: Where the hosts come from, as Open MPI reads it.
DEFAULT_HOSTFILE = "OMPI_MCA_orte_default_hostfile"
DEFAULT_SLOTS = "OMPI_MCA_orte_set_default_slots"
#: Open MPI's own default host file as Debian installs it (comments only): not a job's.
OPEN_MPI_DEFAULT = "/etc/openmpi/openmpi-default-hostfile"
ROLE = "K_MPI_JOB_ROLE"
VOLCANO = "MPI_HOST"
#: The pod's own identity, and the launcher's device variables (empty there unless it is a
#: worker too, read by the container runtime at the pod's start).
POD_ONLY = frozenset({"HOSTNAME", ROLE, "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES"})

#: ``(variable, path) -> text``: how a reader reads a file an engine names.
Read = Callable[[str, str], str]


def read_default_hostfile(
    environ: Mapping[str, str], read: Read, global_args: Sequence[str] = (), *,
    expand: hostfile.Expand | None = None,
) -> Allocation | None:  # fmt: skip
    """The job in Open MPI's default host file (a Kubernetes launcher's), or None."""
    variable, path = DEFAULT_HOSTFILE, environ.get(DEFAULT_HOSTFILE, "").strip()
    given = mca_value(global_args, "orte_default_hostfile")
    if given:
        variable, path = "--mca orte_default_hostfile", given
    if not path or path == OPEN_MPI_DEFAULT:
        return None
    slots_text = environ.get(DEFAULT_SLOTS, "").strip()
    default = (
        int(slots_text)
        if slots_text.isascii() and slots_text.isdigit() and int(slots_text) > 0
        else None
    )
    listed = hostfile.parse(
        read(variable, path), variable, path, default_slots=default, expand=expand
    )
    if environ.get(ROLE):
        engine = "Kubernetes MPIJob (MPI Operator v2)"
    elif environ.get("KUBERNETES_SERVICE_HOST"):
        engine = "Kubernetes TrainJob (Trainer v2, MPI runtime)"
    else:
        engine = "Open MPI's default host file"
    return Allocation(
        engine, "", listed.hosts, listed.slots, variable, path,
        local_only=POD_ONLY, slotted=listed.slotted,
        more=f"give the hosts more slots in {path} (slotsPerWorker in an MPIJob)",
    )  # fmt: skip


def read_volcano(environ: Mapping[str, str]) -> Allocation | None:
    """Volcano's ``MPI_HOST`` (the workers, comma-separated, no slots), or None."""
    text = environ.get(VOLCANO, "").strip()
    if not text:
        return None
    hosts = tuple(dict.fromkeys(h.strip() for h in text.split(",") if h.strip()))
    if not hosts:
        return None
    return Allocation(
        "Kubernetes (Volcano MPI plugin)", "", hosts, (1,) * len(hosts), VOLCANO,
        local_only=POD_ONLY, slotted=False,
    )  # fmt: skip
