"""Model parallelism: block annotations, stages, execution strategies, the stage runner.

The PopTorch surface: a model is split into *blocks* (``BeginBlock`` on a submodule, or
``with Block(...)`` around calls in ``forward``); blocks are grouped into *stages*
(``Stage("B1", "B2").ipu(0)``); a strategy (``PipelinedExecution`` or
``ShardedExecution``) says how the stages run on the replica's devices.  Here a device
is a GPU when present, otherwise a CPU worker thread with its share of torch's
intra-op threads.  ``StageRunner`` is the narrow interface the executor calls.

This package's ``__init__`` is its only door: the annotations and strategies live in
``blocks``, the tracing and splitting in ``stages``, staging at block boundaries as the
model runs (where torch.fx cannot trace) in ``eager``, the schedules and the worker threads
in ``schedule``, and nothing outside the package imports those modules.
"""

from __future__ import annotations

from popdist_torch.enums import AutoStage
from popdist_torch.errors import PipelineError
from popdist_torch.pipeline.blocks import (
    BeginBlock,
    Block,
    BlockFunction,
    BlocksPlaced,
    ExecutionStrategy,
    ParallelPhasedExecution,
    Phase,
    PhasedExecution,
    PipelinedExecution,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
    check_accumulation,
    has_block_annotations,
    note_checkpoint,
    removeBlocks,
    watch_blocks,
)
from popdist_torch.pipeline.schedule import (
    MicroBatch,
    StageEvent,
    StageRunner,
    chrome_trace,
    pipeline_ops,
    record_schedule,
    sharded_order,
    stage_devices,
)

__all__ = [
    "AutoStage",
    "BeginBlock",
    "Block",
    "BlockFunction",
    "BlocksPlaced",
    "ExecutionStrategy",
    "MicroBatch",
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
    "note_checkpoint",
    "pipeline_ops",
    "record_schedule",
    "removeBlocks",
    "sharded_order",
    "stage_devices",
    "watch_blocks",
]
