"""popdist_torch: a PopTorch-like data-parallel executor on torch and Horovod.

``import popdist_torch as poptorch`` lets a PopTorch script run here unchanged: every
public PopTorch name is here, supported, accepted as a documented no-op, or a callable
that raises :class:`UnsupportedOptionError` naming what to use instead
(``docs/poptorch-names.md``). With the opt-in PopTorch names (``poprun
--poptorch-modules``, :data:`popdist.env.POPTORCH_MODULES`) even that line stays as it was:
``import poptorch`` is this module (:mod:`_popdist_poptorch`).
"""

import warnings as _warnings
from typing import Any as _Any

from _popdist_poptorch import MODULES as _MODULES
from _popdist_poptorch import VERSION as _VERSION
from popdist.heap import freeze_imports as _freeze_imports
from popdist_torch import optim
from popdist_torch.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from popdist_torch.data import AsynchronousDataAccessor, DataLoader
from popdist_torch.enums import (
    AutoStage,
    CommGroupType,
    ConnectionType,
    DataLoaderMode,
    HalfFloatCastingBehavior,
    Liveness,
    MatMulSerializationMode,
    MeanReductionStrategy,
    MultiConvPlanType,
    OutputMode,
    OverlapMode,
    ReductionType,
    SharingStrategy,
    SyncPattern,
    VariableRetrievalMode,
)
from popdist_torch.errors import (
    CollectiveError,
    DataLoaderError,
    ExecutorStateError,
    OptimizerError,
    PopdistTorchError,
)
from popdist_torch.execution.executor import (
    ExecutorError,
    PoplarExecutor,
    identity_loss,
    inferenceModel,
    trainingModel,
)
from popdist_torch.options import (
    FrozenOptionsError,
    Options,
    OptionsError,
    PopdistOptions,
    TensorLocationSettings,
    UnsupportedOptionError,
)
from popdist_torch.pipeline import (
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
    removeBlocks,
)
from popdist_torch.surface import profiling
from popdist_torch.surface.graph_ops import register as _register_graph_ops
from popdist_torch.surface.ops import (
    CPU,
    Attribute,
    MultiConv,
    NameScope,
    cond,
    dynamic_slice,
    dynamic_update,
    for_loop,
    ipu_print_tensor,
    nop,
    recomputationCheckpoint,
    serializedMatMul,
    set_available_memory,
    set_overlap_for_input,
    set_overlap_for_output,
)
from popdist_torch.surface.toplevel import (
    Error,
    ICustomArgParser,
    RecoverableError,
    UnrecoverableError,
    accessAttributes,
    ctc_beam_search_decoder,
    custom_op,
    fps,
    getIpuTensorId,
    importPoptorchMetadataFromFile,
    ipuHardwareIsAvailable,
    ipuHardwareVersion,
    isRunningOnIpu,
    load,
    nearest,
    registerCustomArgParser,
    registerPostCompileHook,
    registerPreCompileHook,
    setLogLevel,
)

__all__ = [
    "CPU",
    "AsynchronousDataAccessor",
    "Attribute",
    "AutoStage",
    "BeginBlock",
    "Block",
    "BlockFunction",
    "CheckpointError",
    "CollectiveError",
    "CommGroupType",
    "ConnectionType",
    "DataLoader",
    "DataLoaderError",
    "DataLoaderMode",
    "Error",
    "ExecutorError",
    "ExecutorStateError",
    "FrozenOptionsError",
    "HalfFloatCastingBehavior",
    "ICustomArgParser",
    "Liveness",
    "MatMulSerializationMode",
    "MeanReductionStrategy",
    "MultiConv",
    "MultiConvPlanType",
    "NameScope",
    "OptimizerError",
    "Options",
    "OptionsError",
    "OutputMode",
    "OverlapMode",
    "ParallelPhasedExecution",
    "Phase",
    "PhasedExecution",
    "PipelineError",
    "PipelinedExecution",
    "PopdistOptions",
    "PopdistTorchError",
    "PoplarExecutor",
    "RecoverableError",
    "ReductionType",
    "SerialPhasedExecution",
    "ShardedExecution",
    "SharingStrategy",
    "Stage",
    "SyncPattern",
    "TensorLocationSettings",
    "UnrecoverableError",
    "UnsupportedOptionError",
    "VariableRetrievalMode",
    "accessAttributes",
    "cond",
    "ctc_beam_search_decoder",
    "custom_op",
    "dynamic_slice",
    "dynamic_update",
    "for_loop",
    "fps",
    "getIpuTensorId",
    "identity_loss",
    "importPoptorchMetadataFromFile",
    "inferenceModel",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "ipu_print_tensor",
    "isRunningOnIpu",
    "load",
    "load_checkpoint",
    "nearest",
    "nop",
    "optim",
    "profiling",
    "recomputationCheckpoint",
    "registerCustomArgParser",
    "registerPostCompileHook",
    "registerPreCompileHook",
    "removeBlocks",
    "save_checkpoint",
    "serializedMatMul",
    "setLogLevel",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
    "trainingModel",
]

#: PopTorch's ``poptorch.__version__`` form, ``<release>-<snapshot>``: "3.3.0-popdist.0.1.0".
__version__ = _VERSION

_register_graph_ops()  # torch.ops.poptorch.*, as PopTorch registers them
_freeze_imports()  # torch's import-time heap: no later collection walks it (popdist.heap)

#: Names PopTorch deprecated and later removed: reachable, with a warning on access.
_DEPRECATED = {"AnchorMode": "poptorch.OutputMode (PopTorch 2.4 renamed AnchorMode)"}


#: PopTorch's submodules that programs reach as attributes (``poptorch._impl``,
#: ``poptorch._poplar_executor.PoplarExecutor``), and the project's module each one is.
_SUBMODULES = {
    name.partition(".")[2]: target
    for name, target in _MODULES.items()
    if name.startswith("poptorch.")
}


def __getattr__(name: str) -> _Any:
    """``poptorch.AnchorMode``: PopTorch's old name of ``OutputMode``, with a warning; and
    PopTorch's submodules as attributes (``poptorch._impl``), imported on first use."""
    if name in _DEPRECATED:
        _warnings.warn(
            f"poptorch.{name} is deprecated: use {_DEPRECATED[name]}", FutureWarning, stacklevel=2
        )
        from popdist_torch.enums import AnchorMode

        return AnchorMode
    if name in _SUBMODULES:
        import importlib

        module = importlib.import_module(_SUBMODULES[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_DEPRECATED, *_SUBMODULES})
