"""Model parallelism: block annotations, stages, execution strategies, the stage runner.

The PopTorch surface: a model is split into *blocks* (``BeginBlock`` on a submodule, or
``with Block(...)`` around calls in ``forward``); blocks are grouped into *stages*
(``Stage("B1", "B2").ipu(0)``); a strategy (``PipelinedExecution`` or
``ShardedExecution``) says how the stages run on the replica's devices.  Here a device
is a GPU when present, otherwise a CPU worker thread with its share of torch's
intra-op threads.  ``StageRunner`` is the narrow interface the executor calls; the
tracing and splitting live in :mod:`popdist_torch._stages`, the schedules and the
worker threads in :mod:`popdist_torch._schedule`.
"""

from __future__ import annotations

from popdist_torch._blocks import (
    BeginBlock,
    Block,
    BlockFunction,
    ParallelPhasedExecution,
    Phase,
    PhasedExecution,
    PipelinedExecution,
    PipelineError,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
    _ExecutionStrategy,  # noqa: F401 - Options.setExecutionStrategy checks against it
    check_accumulation,
    has_block_annotations,
    removeBlocks,
)
from popdist_torch._schedule import StageEvent, StageRunner, chrome_trace, record_schedule
from popdist_torch.enums import AutoStage

__all__ = [
    "AutoStage",
    "BeginBlock",
    "Block",
    "BlockFunction",
    "ParallelPhasedExecution",
    "Phase",
    "PhasedExecution",
    "PipelineError",
    "PipelinedExecution",
    "SerialPhasedExecution",
    "ShardedExecution",
    "Stage",
    "StageEvent",
    "StageRunner",
    "check_accumulation",
    "chrome_trace",
    "has_block_annotations",
    "record_schedule",
    "removeBlocks",
]
