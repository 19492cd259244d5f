"""``PopdistOptions`` (``popdist.poptorch.Options``): PopTorch options that follow the launch.

The replication factor is this instance's local replica count, the distributed process
id/count are the instance index/count and the devices per replica are poprun's
``--ipus-per-replica``, all read through popdist. The setters that would contradict the
launch are locked, with PopDist's messages.
"""

from __future__ import annotations

from typing import NoReturn

from popdist.env import read_run
from popdist_torch.errors import OptionsError, UnsupportedOptionError
from popdist_torch.options.distributed import DistributedOptions
from popdist_torch.options.options import Options

__all__ = ["PopdistDistributedOptions", "PopdistOptions"]


def _blocked(name: str) -> NoReturn:
    raise UnsupportedOptionError(f"Cannot call `{name}` with popdist.poptorch.Options")


class PopdistDistributedOptions(DistributedOptions):
    """``Distributed`` options whose process id and count come from the launch, locked."""

    def configureProcessId(self, process_id: int, num_processes: int) -> NoReturn:
        _blocked("Distributed.configureProcessId")

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> NoReturn:
        _blocked("Distributed.setEnvVarNames")

    def disable(self) -> NoReturn:
        _blocked("Distributed.disable")


class PopdistOptions(Options):
    """PopTorch options set up from the poprun launch (local replicas, instance id, devices).

    ``ipus_per_replica``: devices per replica (default: poprun's ``--ipus-per-replica``).
    """

    def __init__(self, ipus_per_replica: int | None = None) -> None:
        super().__init__()
        run = read_run()
        try:
            devices = int(
                run.num_ipus_per_replica if ipus_per_replica is None else ipus_per_replica
            )
        except (TypeError, ValueError):
            devices = 0
        if devices < 1:
            raise OptionsError(
                f"popdist.poptorch.Options(ipus_per_replica={ipus_per_replica!r}): expected an "
                f"integer >= 1"
            )
        self._ipus_per_replica = devices
        self._replication_factor = run.num_local_replicas
        self.Distributed = PopdistDistributedOptions()

    def replicationFactor(self, replication_factor: int) -> NoReturn:
        _blocked("replicationFactor")

    def useIpuId(self, ipu_id: int) -> NoReturn:
        _blocked("useIpuId")
