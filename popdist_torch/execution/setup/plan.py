"""The executor's set-up as one pure plan: device, runner, reduction, staging, capture.

A wrapped model's set-up is decided once, from three things: its options, two facts of the
model (:class:`ModelFacts`) and the world its process runs in (:class:`World`: the device
an unstaged model would compute on, the GPUs it sees, whether its collectives reach other
processes, the replicas of every instance, whether the device can capture graphs).
:func:`resolve` turns them into a frozen :class:`ExecutorPlan`, as poprun turns a
``RunConfig`` into a ``Topology``; the executor builds its pieces from the plan (placement,
reducer, runner, the captured step) and decides nothing else. A model found to place its
``Block`` contexts at its first call is resolved again with ``staged=True``.

:func:`resolve` reads nothing and changes nothing, so tests drive it with fake worlds; the
one bad combination it meets (the deterministic reduction of a staged model) raises one
line naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from popdist_torch.enums import ReductionType
from popdist_torch.errors import ExecutorError
from popdist_torch.execution.capture.eligibility import plan_refusal
from popdist_torch.options import Options

__all__ = ["NO_DETERMINISTIC_STAGES", "ExecutorPlan", "ModelFacts", "World", "resolve"]

CPU = torch.device("cpu")

NO_DETERMINISTIC_STAGES = (
    "Training.deterministicReduction (or poprun --deterministic-reduction) runs whole "
    "replicas one by one; a model split into stages cannot use it: turn it off, or run "
    "the model unstaged"
)


@dataclass(frozen=True)
class ModelFacts:
    """What the plan needs of the model: whether it runs in stages (an execution strategy,
    ``Block`` annotations, or ``Block`` contexts placed at its first call) and whether an
    ``Output___`` anchor hooks one of its submodules."""

    staged: bool
    output_anchors: bool = False


@dataclass(frozen=True)
class World:
    """The process's world: ``device``, where an unstaged model computes
    (:func:`~popdist_torch.execution.placement.choose_device`); ``visible_gpus``, the CUDA
    devices it sees (``CUDA_VISIBLE_DEVICES``); ``communicates``, whether its collectives
    reach other processes; ``replica_counts``, every instance's local replicas in instance
    order; ``captures``, whether ``device`` has a graph backend."""

    device: torch.device
    visible_gpus: int = 0
    communicates: bool = False
    replica_counts: tuple[int, ...] = (1,)
    captures: bool = False


@dataclass(frozen=True)
class ExecutorPlan:
    """How one wrapped model runs, decided once.

    ``device``: the module, its optimizer state and every batch; ``stage_gpus``: the GPUs a
    staged replica's stages share (0: CPU workers); ``runner``: ``"local"`` (the replicas
    in one ``vmap`` or in turn), ``"staged"`` or ``"deterministic"``; ``reducer``: gradients
    are reduced over the other instances by hooks that overlap backward; ``average``: that
    reduction averages (a Mean over an even split); ``mean_over``: the replicas a Mean
    divides each loss by (``None``: this instance's); ``shards``: the optimizer state is
    sharded over the instances; ``watch_blocks``: the first call watches for placed
    ``Block`` contexts; ``autocast``: the autocast type's name; ``captures``: ``device``
    has a graph backend (the world's); ``capture_refusal``: why the fused micro-step is not
    captured in a graph (``None``: it may be, once the first calls have shown it is a fixed
    sequence of kernels).
    """

    training: bool
    device: torch.device
    stage_gpus: int
    runner: str
    reducer: bool
    average: bool
    mean_over: int | None
    shards: bool
    communicates: bool
    replica_counts: tuple[int, ...]
    watch_blocks: bool
    autocast: str | None
    captures: bool
    capture_refusal: str | None

    @property
    def outputs_to_host(self) -> bool:
        """Whether outputs are computed off the host and must come back to it."""
        return self.device != CPU or self.stage_gpus > 0


def resolve(options: Options, facts: ModelFacts, world: World, *, training: bool) -> ExecutorPlan:
    """The plan of a model with these ``facts``, under ``options``, in ``world`` (pure)."""
    counts = world.replica_counts
    deterministic = training and options.Training.deterministic_reduction
    if deterministic and facts.staged:
        raise ExecutorError(NO_DETERMINISTIC_STAGES)
    runner = "deterministic" if deterministic else "staged" if facts.staged else "local"
    uniform = len(set(counts)) == 1
    mean = options.Training.accumulation_and_replication_reduction_type == ReductionType.Mean
    reducer = training and world.communicates and not deterministic
    precision = options.Precision
    autocast = precision.autocast_dtype if precision.autocast_enabled else None
    stage_gpus = world.visible_gpus if facts.staged and world.device.type == "cuda" else 0
    refusal = plan_refusal(
        training=training,
        replicas=options.replication_factor,
        device_captures=world.captures,
        enabled=options.Training.cuda_graphs,
        runner=runner,
        reducer=reducer,
        output_anchors=facts.output_anchors,
        autocast=autocast is not None,
    )
    return ExecutorPlan(
        training=training,
        device=CPU if facts.staged and not stage_gpus else world.device,
        stage_gpus=stage_gpus,
        runner=runner,
        reducer=reducer,
        average=mean and uniform,
        mean_over=None if uniform and not deterministic else sum(counts),
        shards=training and world.communicates and options.TensorLocations.optimizer_sharded,
        communicates=world.communicates,
        replica_counts=counts,
        watch_blocks=not facts.staged,
        autocast=autocast,
        captures=world.captures,
        capture_refusal=refusal,
    )
