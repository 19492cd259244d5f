"""Make ``accelerator="ipu"`` a Lightning name whose default strategy is ``IPUStrategy``.

Lightning picks a strategy for ``strategy="auto"`` from a fixed list (one device: a
single-device strategy on the CPU; several: DDP, which spawns copies of the script). An
accelerator cannot name its own default, so the connector's choice is wrapped: with the
"ipu" accelerator it is ``IPUStrategy``, otherwise Lightning's own.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

__all__ = ["register"]

_MARK = "_popdist_lightning_default"


def register() -> None:
    """Register the accelerator and strategy; wrap the default-strategy choice once."""
    from popdist_lightning.accelerator import IPUAccelerator
    from popdist_lightning.environment import PopdistEnvironment
    from popdist_lightning.strategy import IPUStrategy

    IPUAccelerator.register_accelerators(AcceleratorRegistry)
    IPUStrategy.register_strategies(StrategyRegistry)
    original = _AcceleratorConnector._choose_strategy
    if getattr(original, _MARK, False):
        return
    original_environment = _AcceleratorConnector._choose_and_init_cluster_environment

    def _choose_strategy(self: Any) -> Any:
        if isinstance(getattr(self, "accelerator", None), IPUAccelerator):
            return IPUStrategy.strategy_name
        return original(self)

    def _choose_and_init_cluster_environment(self: Any) -> Any:
        # Lightning's MPI detection initialises MPI through mpi4py (a singleton orted
        # outside a launcher); with "ipu" the ranks come from popdist instead.
        if self._cluster_environment_flag is None and isinstance(
            getattr(self, "accelerator", None), IPUAccelerator
        ):
            return PopdistEnvironment()
        return original_environment(self)

    setattr(_choose_strategy, _MARK, True)
    _AcceleratorConnector._choose_strategy = _choose_strategy  # type: ignore[method-assign]
    _AcceleratorConnector._choose_and_init_cluster_environment = (  # type: ignore[method-assign]
        _choose_and_init_cluster_environment
    )
