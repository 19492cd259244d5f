"""The PopDist getters: this instance's place in the run, read from the environment.

Every getter re-reads the environment (through :func:`popdist.env.read_run`), so it answers
for the process as it is now and a test can change the environment between calls. Outside
poprun the answers are PopDist's defaults: one instance, one replica, offset 0,
``isPopdistEnvSet()`` False; under a plain ``mpirun`` Open MPI's ``OMPI_COMM_WORLD_*`` stand
in (one instance per rank, one replica each). A half-set or malformed environment raises
:class:`~popdist.env.PopdistError` naming the variable and its value.
"""

from __future__ import annotations

from popdist.env import PopdistError, read_run

__all__ = [
    "checkNumIpusPerReplica",
    "getDeviceId",
    "getInstanceIndex",
    "getLocalInstanceIndex",
    "getNumInstances",
    "getNumIpusPerReplica",
    "getNumLocalReplicas",
    "getNumTotalReplicas",
    "getReplicaIndexOffset",
    "isPopdistEnvSet",
]


def isPopdistEnvSet() -> bool:
    """True when this process was launched by poprun (the ``POPDIST_*`` set is present)."""
    return read_run().from_poprun


def getNumTotalReplicas() -> int:
    """Replicas over all instances (1 outside poprun)."""
    return read_run().num_total_replicas


def getNumLocalReplicas() -> int:
    """Replicas of this instance: PopTorch's ``replicationFactor`` (1 outside poprun)."""
    return read_run().num_local_replicas


def getNumIpusPerReplica() -> int:
    """Devices of one replica, poprun's ``--ipus-per-replica`` (1 outside poprun)."""
    return read_run().num_ipus_per_replica


def checkNumIpusPerReplica(numIpusPerReplica: int) -> bool:
    """Whether ``numIpusPerReplica`` agrees with the launch.

    Under poprun: equal to ``--ipus-per-replica``. Outside it there is no launch to
    contradict and a CPU host can give a replica any number of devices, so any count of at
    least 1 fits.
    """
    if isinstance(numIpusPerReplica, bool) or not isinstance(numIpusPerReplica, int):
        raise PopdistError(f"numIpusPerReplica={numIpusPerReplica!r}: expected an integer >= 1")
    run = read_run()
    if run.from_poprun:
        return numIpusPerReplica == run.num_ipus_per_replica
    return numIpusPerReplica >= 1


def getReplicaIndexOffset() -> int:
    """Global index of this instance's first replica (0 outside poprun)."""
    return read_run().replica_index_offset


def getInstanceIndex() -> int:
    """This instance's index in ``[0, getNumInstances())`` (0 outside poprun)."""
    return read_run().instance_index


def getNumInstances() -> int:
    """Instances in the run (1 outside poprun)."""
    return read_run().num_instances


def getLocalInstanceIndex() -> int:
    """This instance's index among the instances on its host (0 outside poprun)."""
    return read_run().local_instance_index


def _next_power_of_two(value: int) -> int:
    return 1 << (value - 1).bit_length()


def getDeviceId(ipusPerReplica: int = 0) -> int:
    """Id of the multi-device group that holds this instance's replicas.

    Numbered as an IPU-POD numbers its devices: over a system of ``instances × group``
    devices (rounded up to a power of two), the single devices come first, then the pairs,
    the quads, …; this instance owns group ``getInstanceIndex()`` of the smallest
    power-of-two size holding its ``getNumLocalReplicas() × ipusPerReplica`` devices. So 4
    instances × 2 replicas × 2 devices give 24, 25, 26, 27, as on Graphcore's POD16. Here
    the id names the instance's devices in logs and caches; no hardware is acquired.
    ``ipusPerReplica=0`` means the launch's ``--ipus-per-replica``.
    """
    if (
        isinstance(ipusPerReplica, bool)
        or not isinstance(ipusPerReplica, int)
        or ipusPerReplica < 0
    ):
        raise PopdistError(
            f"ipusPerReplica={ipusPerReplica!r}: expected an integer >= 1, or 0 for the launch's"
        )
    run = read_run()
    ipr = ipusPerReplica or run.num_ipus_per_replica
    # A non-uniform split: every instance's group is sized for the largest.
    group = _next_power_of_two(max(run.replica_counts()) * ipr)
    system = _next_power_of_two(group * run.num_instances)
    first = sum(system // (1 << k) for k in range(group.bit_length() - 1))
    return first + run.instance_index
