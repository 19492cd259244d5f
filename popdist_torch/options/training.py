"""``opts.Training``: gradient accumulation, how gradients are reduced, the captured step."""

from __future__ import annotations

from typing import Any

from popdist.env import PopdistError, read_cuda_graphs, read_deterministic_reduction
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
        self._deterministic: bool | None = None  # None: poprun --deterministic-reduction
        self._cuda_graphs: bool | None = None  # None: the environment's, else on

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

    @property
    def deterministic_reduction(self) -> bool:
        """Whether the sum over replicas is the same bits whatever the split.

        ``deterministicReduction()``'s value, else poprun's ``--deterministic-reduction``
        (read through :func:`popdist.env.read_deterministic_reduction`), else False.
        """
        if self._deterministic is not None:
            return self._deterministic
        try:
            return read_deterministic_reduction()
        except PopdistError as exc:
            raise OptionsError(str(exc)) from None

    def deterministicReduction(self, enabled: bool = True) -> TrainingOptions:
        """Reduce gradients over replicas in a fixed order (project extension, not PopTorch's).

        Each replica's gradient is computed on its own and the gradients are added in global
        replica order on every instance, so the weights do not depend on how the replicas
        are split over instances and local replicas (:mod:`popdist_torch.execution.deterministic`).
        """
        self._check_mutable("deterministicReduction")
        if not isinstance(enabled, bool):
            raise OptionsError(
                f"Training.deterministicReduction({enabled!r}): expected True or False"
            )
        self._deterministic = enabled
        return self

    @property
    def cuda_graphs(self) -> bool:
        """Whether the training micro-step may be captured in a CUDA graph (on a GPU).

        ``cudaGraphs()``'s value, else the environment's (:func:`popdist.env.read_cuda_graphs`:
        :data:`popdist.env.CUDA_GRAPHS` set to ``0`` turns it off), else True.
        """
        if self._cuda_graphs is not None:
            return self._cuda_graphs
        try:
            return read_cuda_graphs()
        except PopdistError as exc:
            raise OptionsError(str(exc)) from None

    def cudaGraphs(self, enabled: bool = True) -> TrainingOptions:
        """Capture the fused training micro-step in a CUDA graph (project extension).

        On by default where it gives the eager step's numbers (docs/executor.md); ``False``
        runs every step eagerly, as :data:`popdist.env.CUDA_GRAPHS` set to ``0`` does.
        """
        self._check_mutable("cudaGraphs")
        if not isinstance(enabled, bool):
            raise OptionsError(f"Training.cudaGraphs({enabled!r}): expected True or False")
        self._cuda_graphs = enabled
        return self

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
            "deterministic_reduction": self.deterministic_reduction,
            "cuda_graphs": self.cuda_graphs,
        }
