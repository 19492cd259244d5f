"""``PopdistEnvironment``: Lightning's view of the run, read through ``popdist``.

Processes are created by ``poprun`` (or ``mpirun``), never by Lightning: the environment
says so (``creates_processes_externally``), and the ranks are the PopDist getters'
answers: world size = instances, global rank = instance index, local rank = the
instance's index on its host. Outside a launcher it is one instance of rank 0.
"""

from __future__ import annotations

from lightning.fabric.plugins import ClusterEnvironment

import popdist

__all__ = ["PopdistEnvironment"]


class PopdistEnvironment(ClusterEnvironment):
    """Ranks from ``popdist``; the launcher created the processes."""

    @property
    def creates_processes_externally(self) -> bool:
        """Always: poprun starts the instances, Lightning must not spawn any."""
        return True

    @property
    def main_address(self) -> str:
        """Unused (popdist's collectives backend connects the instances)."""
        return "127.0.0.1"

    @property
    def main_port(self) -> int:
        """Unused (see :attr:`main_address`)."""
        return 0

    @staticmethod
    def detect() -> bool:
        """Whether this process was launched by poprun."""
        return popdist.isPopdistEnvSet()

    def world_size(self) -> int:
        """Instances in the run."""
        return popdist.getNumInstances()

    def set_world_size(self, size: int) -> None:
        """Ignored: the launch fixes the number of instances."""

    def global_rank(self) -> int:
        """This instance's index."""
        return popdist.getInstanceIndex()

    def set_global_rank(self, rank: int) -> None:
        """Ignored: the launch fixes the instance index."""

    def local_rank(self) -> int:
        """This instance's index among the instances of its host."""
        return popdist.getLocalInstanceIndex()

    def node_rank(self) -> int:
        """0: Lightning's node rank is not used by this strategy (hosts are poprun's)."""
        return 0
