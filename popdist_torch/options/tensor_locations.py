"""``opts.TensorLocations`` and ``TensorLocationSettings``: where tensors are kept.

Only the optimizer state's place has an effect here: on the device, or in host memory
between weight updates (``useOnChipStorage(False)``), and sharded over the instances
(``useReplicatedTensorSharding(True)``, :mod:`popdist_torch.optim.sharded`); activations,
weights and accumulators stay where torch keeps them.
"""

from __future__ import annotations

from typing import Any

from popdist_torch.errors import OptionsError
from popdist_torch.options.group import OptionGroup, install_setters
from popdist_torch.surface.rows import whole_number

__all__ = ["TensorLocationOptions", "TensorLocationSettings"]


@install_setters
class TensorLocationSettings(OptionGroup):
    """Where a class of tensors lives; ``useOnChipStorage``, ``useReplicatedTensorSharding``
    and ``minElementsForReplicatedTensorSharding`` have an effect here (on optimizer state)."""

    _owner = "TensorLocationSettings"

    def __init__(self) -> None:
        super().__init__()
        self.on_chip = True
        self.replicated_sharding: bool | None = None  # PopTorch has the keys once they are set
        self.sharding_min_elements: int | None = None

    def useOnChipStorage(self, use: bool = True) -> TensorLocationSettings:
        """``False``: keep the tensors in host memory between weight updates."""
        self.on_chip = bool(use)
        return self

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:
        """``True``: shard the optimizer state over the instances (the numbers do not change)."""
        self.replicated_sharding = bool(use)
        return self

    def minElementsForReplicatedTensorSharding(self, min_elements: int) -> TensorLocationSettings:
        """Shard only the state of tensors with more than ``min_elements`` elements."""
        self.sharding_min_elements = whole_number(
            "TensorLocationSettings.minElementsForReplicatedTensorSharding", min_elements, minimum=0
        )
        return self

    def _values(self) -> dict[str, Any]:
        values = {"onChip": int(self.on_chip)}  # PopTorch's keys and types
        if self.replicated_sharding is not None:
            values["useReplicatedTensorSharding"] = int(self.replicated_sharding)
        if self.sharding_min_elements is not None:
            values["minElementsForReplicatedTensorSharding"] = self.sharding_min_elements
        return values

    def __repr__(self) -> str:
        return f"TensorLocationSettings(on_chip={self.on_chip})"


@install_setters
class TensorLocationOptions(OptionGroup):
    """``opts.TensorLocations``: where optimizer state is kept between updates."""

    _owner = "Options.TensorLocations"

    def __init__(self) -> None:
        super().__init__()
        self._optimizer_on_chip = True
        self._optimizer_sharded = False
        self._sharding_min_elements = 0
        self._optimizer_location: dict[str, Any] | None = None

    @property
    def optimizer_on_chip(self) -> bool:
        """``False``: optimizer state sits in host memory, moved to the device per update."""
        return self._optimizer_on_chip

    @property
    def optimizer_sharded(self) -> bool:
        """``True``: each instance keeps and updates the optimizer state of its shard only."""
        return self._optimizer_sharded

    @property
    def sharding_min_elements(self) -> int:
        """Only the state of tensors with more elements than this is sharded (default 0)."""
        return self._sharding_min_elements

    def setOptimizerLocation(self, location: TensorLocationSettings) -> TensorLocationOptions:
        """Keep optimizer state on the device (default) or in host memory."""
        self._check_mutable("setOptimizerLocation")
        if not isinstance(location, TensorLocationSettings):
            raise OptionsError(
                f"TensorLocations.setOptimizerLocation({location!r}): expected a "
                f"TensorLocationSettings, e.g. TensorLocationSettings().useOnChipStorage(False)"
            )
        self._optimizer_on_chip = location.on_chip
        self._optimizer_sharded = bool(location.replicated_sharding)
        self._sharding_min_elements = location.sharding_min_elements or 0
        self._optimizer_location = location.toDict()
        return self

    def _values(self) -> dict[str, Any]:
        values: dict[str, Any] = {
            "optimizer_on_chip": self._optimizer_on_chip,
            "optimizer_sharded": self._optimizer_sharded,
        }
        if self._optimizer_location is not None:  # PopTorch has it once it is set
            values["location_optimizer"] = self._optimizer_location
        return values
