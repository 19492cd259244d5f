"""``popdist.poptorch.Options``: PopTorch options that follow the poprun launch.

The replication factor is this instance's local replica count and the distributed
process id/count are the instance index/count, all read from the environment poprun
set.  The setters that would contradict the launch are locked, with PopDist's messages.
"""

from __future__ import annotations

from typing import Any, NoReturn

from popdist_torch.options import Options as _PoptorchOptions
from popdist_torch.options import _DistributedOptions

__all__ = ["Options"]


def _blocked(name: str) -> NoReturn:
    raise RuntimeError(f"Cannot call `{name}` with popdist.poptorch.Options")


class _PopdistDistributedOptions(_DistributedOptions):
    """``Distributed`` options whose process id and count come from poprun."""

    def configureProcessId(self, process_id: int, num_processes: int) -> NoReturn:
        _blocked("Distributed.configureProcessId")

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> NoReturn:
        _blocked("Distributed.setEnvVarNames")

    def disable(self) -> NoReturn:
        _blocked("Distributed.disable")


class Options(_PoptorchOptions):
    """PopTorch options set up from the poprun launch (local replicas, instance id).

    ``ipus_per_replica``: devices per replica (default: poprun's ``--ipus-per-replica``).
    """

    def __init__(self, ipus_per_replica: int | None = None) -> None:
        super().__init__()
        import popdist

        local = popdist.getNumLocalReplicas()
        index, count = popdist.getInstanceIndex(), popdist.getNumInstances()
        self._ipus_per_replica = (
            popdist.getNumIpusPerReplica() if ipus_per_replica is None else int(ipus_per_replica)
        )
        if self._ipus_per_replica < 1:
            raise ValueError(
                f"popdist.poptorch.Options(ipus_per_replica={ipus_per_replica!r}): expected an "
                f"integer >= 1"
            )
        self._replication_factor = local
        self.Distributed.__class__ = _PopdistDistributedOptions
        self.Distributed._configure(index, count)

    @property
    def ipus_per_replica(self) -> int:
        """Devices per replica (used by a model-parallel execution strategy)."""
        return self._ipus_per_replica

    def replicationFactor(self, replication_factor: int) -> NoReturn:
        _blocked("replicationFactor")

    def useIpuId(self, ipu_id: int) -> NoReturn:
        _blocked("useIpuId")

    def _values(self) -> dict[str, Any]:
        out = super()._values()
        out["ipus_per_replica"] = self._ipus_per_replica
        return out
