"""``opts.Training``: gradient accumulation and how gradients are reduced."""

from __future__ import annotations

from typing import Any

from popdist_torch.enums import MeanReductionStrategy, ReductionType
from popdist_torch.errors import OptionsError
from popdist_torch.options.group import OptionGroup, install_setters
from popdist_torch.surface.rows import whole_number

__all__ = ["TrainingOptions"]


@install_setters
class TrainingOptions(OptionGroup):
    """``opts.Training``: micro-batches per weight update and the reduction of gradients."""

    _owner = "Options.Training"

    def __init__(self) -> None:
        super().__init__()
        self._gradient_accumulation = 1
        self._reduction = ReductionType.Mean

    @property
    def gradient_accumulation(self) -> int:
        """Micro-batches whose gradients are accumulated per weight update (default 1)."""
        return self._gradient_accumulation

    @gradient_accumulation.setter
    def gradient_accumulation(self, value: int) -> None:
        """``opts.Training.gradient_accumulation = 8``: as ``gradientAccumulation(8)``."""
        self.gradientAccumulation(value)

    @property
    def accumulation_and_replication_reduction_type(self) -> ReductionType:
        """``Mean`` (default) or ``Sum`` over accumulation steps, replicas and instances."""
        return self._reduction

    @accumulation_and_replication_reduction_type.setter
    def accumulation_and_replication_reduction_type(self, value: ReductionType) -> None:
        """Assignment form of ``accumulationAndReplicationReductionType``."""
        self.accumulationAndReplicationReductionType(value)

    def gradientAccumulation(self, gradient_accumulation: int) -> TrainingOptions:
        """Accumulate the gradients of this many micro-batches per weight update."""
        self._check_mutable("gradientAccumulation")
        self._gradient_accumulation = whole_number(
            "Training.gradientAccumulation", gradient_accumulation
        )
        return self

    def accumulationAndReplicationReductionType(
        self, reduction_type: ReductionType
    ) -> TrainingOptions:
        """Reduce gradients over accumulation steps and replicas by ``Mean`` or ``Sum``."""
        self._check_mutable("accumulationAndReplicationReductionType")
        try:
            value = ReductionType(reduction_type)
        except ValueError:
            value = None
        if value not in (ReductionType.Mean, ReductionType.Sum):
            raise OptionsError(
                f"Training.accumulationAndReplicationReductionType({reduction_type!r}): "
                f"expected ReductionType.Mean or ReductionType.Sum"
            )
        self._reduction = value
        return self

    def _values(self) -> dict[str, Any]:
        return {
            "gradient_accumulation": self._gradient_accumulation,
            "accumulation_and_replication_reduction_type": self._reduction,
            "meanAccumulationAndReplicationReductionStrategy": MeanReductionStrategy.Post,
        }
