"""``opts.Distributed``: which process this is among how many."""

from __future__ import annotations

from typing import Any

from popdist.env import PopdistError, read_process, read_run
from popdist_torch.errors import OptionsError
from popdist_torch.options.group import OptionGroup, install_setters
from popdist_torch.surface.rows import whole_number

__all__ = ["DistributedOptions", "replica_counts"]


def replica_counts(num_processes: int, process_id: int, local_replicas: int) -> tuple[int, ...]:
    """Every process's local replicas, in process order, for a process with these numbers.

    poprun's non-uniform split (``RunView.uniform`` false) when the
    numbers are the launch's; otherwise every process holds ``local_replicas`` (the uniform
    split PopTorch assumes).
    """
    run = read_run()
    launched = (run.num_instances, run.instance_index, run.num_local_replicas)
    if not run.uniform and launched == (num_processes, process_id, local_replicas):
        return run.replica_counts()
    return (local_replicas,) * num_processes


@install_setters
class DistributedOptions(OptionGroup):
    """``opts.Distributed``: which process this is among how many.

    By default this instance's index and the instance count, read through popdist (poprun's
    variables, else Open MPI's rank and size, as PopTorch reads them), so a plain
    ``Options()`` under ``mpirun`` or ``poprun`` already shards data.
    """

    _owner = "Options.Distributed"

    def __init__(self) -> None:
        super().__init__()
        run = read_run()
        self._num_processes = 1
        self._process_id = 0
        self._configure(run.instance_index, run.num_instances)

    @property
    def processId(self) -> int:
        """Index of this process (0-based)."""
        return self._process_id

    @property
    def numProcesses(self) -> int:
        """Number of processes the run is distributed over."""
        return self._num_processes

    def _configure(self, process_id: int, num_processes: int) -> None:
        num = whole_number("Distributed.configureProcessId num_processes", num_processes)
        pid = whole_number("Distributed.configureProcessId process_id", process_id, minimum=0)
        if pid >= num:
            raise OptionsError(
                f"Distributed.configureProcessId({process_id}, {num_processes}): the process "
                f"id must be below the number of processes"
            )
        self._process_id, self._num_processes = pid, num

    def configureProcessId(self, process_id: int, num_processes: int) -> DistributedOptions:
        """Set this process's id and the number of processes (without a launcher's env)."""
        self._check_mutable("configureProcessId")
        self._configure(process_id, num_processes)
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> DistributedOptions:
        """Read the process count and id from these environment variables now."""
        self._check_mutable("setEnvVarNames")
        try:
            process_id, num_processes = read_process(var_num_processes, var_process_id)
        except PopdistError as exc:
            raise OptionsError(str(exc)) from None
        self._configure(process_id, num_processes)
        return self

    def disable(self) -> DistributedOptions:
        """Run as a single process (id 0 of 1) whatever the environment says."""
        self._check_mutable("disable")
        self._configure(0, 1)
        return self

    def _values(self) -> dict[str, Any]:
        return {
            "num_distributed_processes": self._num_processes,
            "distributed_process_id": self._process_id,
        }
