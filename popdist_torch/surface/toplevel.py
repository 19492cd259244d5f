"""The rest of PopTorch's top-level surface: hardware queries, logging, hooks, refusals.

``POPTORCH_NAMES`` and ``POPTORCH_OPTION_METHODS`` list PopTorch 3's public API as its
sources and reference documentation define it (``poptorch/__init__.py``, ``ops.py``,
``options.py``, ``enums.py``): every name is reachable as ``popdist_torch.X`` and has a
row in ``docs/poptorch-compatibility.md`` (a test checks both).  A name with no meaning
here is a callable that raises :class:`UnsupportedOptionError` naming what to use, so
``hasattr`` and ``dir`` behave and the error comes where the name is used.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.hooks import RemovableHandle

from popdist_torch._async import Prefetcher
from popdist_torch.errors import PopdistTorchError
from popdist_torch.options import UnsupportedOptionError

__all__ = [
    "POPTORCH_EXECUTOR_METHODS",
    "POPTORCH_NAMES",
    "POPTORCH_OPTION_METHODS",
    "POPTORCH_TENSOR_LOCATION_METHODS",
    "AsynchronousDataAccessor",
    "Error",
    "ICustomArgParser",
    "RecoverableError",
    "UnrecoverableError",
    "accessAttributes",
    "ctc_beam_search_decoder",
    "custom_op",
    "fps",
    "getIpuTensorId",
    "importPoptorchMetadataFromFile",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "isRunningOnIpu",
    "load",
    "nearest",
    "registerCustomArgParser",
    "registerPostCompileHook",
    "registerPreCompileHook",
    "setLogLevel",
]

log = logging.getLogger("popdist_torch")


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    """``False``: there are no IPUs; the executor runs on the host's CPU (or GPUs).

    Scripts that branch on it take their "no hardware" path, which here runs the same
    model on the same executor (``Options.useIpuModel`` is a no-op).
    """
    return False


def ipuHardwareVersion() -> int:
    """PopTorch raises when no IPU is present; so does this."""
    raise UnsupportedOptionError(
        "ipuHardwareVersion(): there is no IPU hardware here (popdist_torch runs on CPU or "
        "GPU); check poptorch.ipuHardwareIsAvailable() first"
    )


def isRunningOnIpu() -> bool:
    """``False``: forward never runs on an IPU here (PopTorch: ``True`` while compiling)."""
    return False


#: PopTorch's log levels and the ``logging`` level each sets on the ``popdist_torch`` logger.
LOG_LEVELS: dict[str, int] = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERR": logging.ERROR,
    "OFF": logging.CRITICAL + 1,
}
_LEVEL_NUMBERS = {0: "TRACE", 1: "DEBUG", 2: "INFO", 3: "WARN", 4: "ERR", 6: "OFF"}


def setLogLevel(level: str | int) -> None:
    """Set how much ``popdist_torch`` logs: ``TRACE``, ``DEBUG``, ``INFO``, ``WARN``, ``ERR``, ``OFF``.

    PopTorch's integers (0 TRACE ... 4 ERR, 6 OFF) are accepted too.
    """
    name = _LEVEL_NUMBERS.get(level) if isinstance(level, int) else level
    if name not in LOG_LEVELS:
        raise ValueError(
            f"setLogLevel({level!r}): expected one of {', '.join(LOG_LEVELS)} "
            "(or PopTorch's integers 0-4, 6)"
        )
    log.setLevel(LOG_LEVELS[name])


class Error(PopdistTorchError, RuntimeError):
    """PopTorch's base error (raised by its compiler); here so ``except poptorch.Error`` works.

    It sits under the package's one root, :class:`PopdistTorchError`, like every other error here.
    """


class RecoverableError(Error):
    """PopTorch's recoverable runtime error; the executor here never raises it."""


class UnrecoverableError(Error):
    """PopTorch's unrecoverable runtime error; the executor here never raises it."""


_hooks: dict[int, Callable[..., Any]] = {}


def registerPreCompileHook(hook: Callable[..., Any]) -> RemovableHandle:
    """Accepted; never called: there is no compilation step."""
    handle = RemovableHandle(_hooks)
    _hooks[handle.id] = hook
    return handle


def registerPostCompileHook(hook: Callable[..., Any]) -> RemovableHandle:
    """Accepted; never called: there is no compilation step."""
    return registerPreCompileHook(hook)


class ICustomArgParser(abc.ABC):
    """PopTorch's interface for custom input types; see ``registerCustomArgParser``."""

    @abc.abstractmethod
    def yieldTensors(self, struct: Any) -> Iterator[Any]:
        """The tensors of ``struct``, in order."""

    @abc.abstractmethod
    def reconstruct(self, original_structure: Any, tensor_iterator: Iterator[Any]) -> Any:
        """``original_structure`` rebuilt from ``tensor_iterator``."""


class AsynchronousDataAccessor:
    """Iterate ``dataset`` (usually a ``DataLoader``) in a background thread.

    Keeps ``buffer_size`` items ready ahead of the consumer, as PopTorch's accessor does
    with a worker process; the other PopTorch arguments are accepted and have no effect.
    """

    def __init__(
        self,
        dataset: Iterable[Any],
        buffer_size: int = 3,
        miss_sleep_time_in_ms: float = 0.1,
        load_indefinitely: bool = True,
        early_preload: bool = False,
        sharing_strategy: Any = None,
        rebatched_size: int | None = None,
    ) -> None:
        self._dataset = dataset
        self._buffer_size = buffer_size
        self._prefetcher: Prefetcher[Any] | None = None

    def __len__(self) -> int:
        return len(self._dataset)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        self.terminate()
        self._prefetcher = Prefetcher(iter(self._dataset), depth=self._buffer_size)
        return iter(self._prefetcher)

    def terminate(self) -> None:
        """Stop the background thread (PopTorch: the worker process)."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def __del__(self) -> None:
        self.terminate()


def _unsupported(name: str, use: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedOptionError(f"poptorch.{name} is not supported by popdist_torch: {use}")

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Not supported here: {use}"
    return refuse


load = _unsupported(
    "load",
    "there are no PopTorch executables; save with popdist_torch.save_checkpoint and restore "
    "with popdist_torch.load_checkpoint, then wrap the model again",
)
importPoptorchMetadataFromFile = _unsupported(
    "importPoptorchMetadataFromFile", "there are no PopTorch executables to read metadata from"
)
ctc_beam_search_decoder = _unsupported(
    "ctc_beam_search_decoder",
    "decode outside the model (e.g. torchaudio.models.decoder.ctc_decoder)",
)
custom_op = _unsupported(
    "custom_op", "there are no Poplar codelets; write the operation in torch inside forward"
)
fps = _unsupported("fps", "use torch_cluster.fps (PopTorch Geometric op)")
nearest = _unsupported("nearest", "use torch_cluster.nearest (PopTorch Geometric op)")
registerCustomArgParser = _unsupported(
    "registerCustomArgParser",
    "pass tensors, or tuples, lists and dicts of tensors (they are walked with torch's pytree)",
)
accessAttributes = _unsupported(
    "accessAttributes", "attributes of inputs are read in forward as plain Python"
)
getIpuTensorId = _unsupported("getIpuTensorId", "tensors have no IPU ids here")


#: PopTorch 3's public top-level names (``poptorch.X``), from its sources and reference.
POPTORCH_NAMES: tuple[str, ...] = (
    # models and data
    "trainingModel",
    "inferenceModel",
    "PoplarExecutor",
    "DataLoader",
    "AsynchronousDataAccessor",
    "Options",
    "TensorLocationSettings",
    "identity_loss",
    "optim",
    "load",
    "isRunningOnIpu",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "setLogLevel",
    "registerPreCompileHook",
    "registerPostCompileHook",
    "ICustomArgParser",
    "registerCustomArgParser",
    "accessAttributes",
    "getIpuTensorId",
    "importPoptorchMetadataFromFile",
    "Error",
    "RecoverableError",
    "UnrecoverableError",
    "profiling",
    # model parallelism
    "Block",
    "BeginBlock",
    "BlockFunction",
    "removeBlocks",
    "Stage",
    "Phase",
    "AutoStage",
    "PipelinedExecution",
    "ShardedExecution",
    "SerialPhasedExecution",
    "ParallelPhasedExecution",
    "PhasedExecution",
    # operations
    "ctc_beam_search_decoder",
    "ipu_print_tensor",
    "for_loop",
    "cond",
    "nop",
    "dynamic_slice",
    "dynamic_update",
    "recomputationCheckpoint",
    "serializedMatMul",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
    "custom_op",
    "CPU",
    "MultiConv",
    "NameScope",
    "fps",
    "nearest",
    # enumerations
    "AnchorMode",
    "OutputMode",
    "ReductionType",
    "MeanReductionStrategy",
    "DataLoaderMode",
    "SharingStrategy",
    "ConnectionType",
    "SyncPattern",
    "HalfFloatCastingBehavior",
    "MatMulSerializationMode",
    "Liveness",
    "OverlapMode",
    "MultiConvPlanType",
    "CommGroupType",
    "VariableRetrievalMode",
)

#: PopTorch 3's ``Options`` setters and those of its groups, by the attribute path from
#: ``Options()`` ("" for ``Options`` itself); ``anchorMode`` and ``defaultAnchorMode``
#: are the deprecated names of PopTorch 2.x.
POPTORCH_OPTION_METHODS: dict[str, tuple[str, ...]] = {
    "": (
        "anchorMode",
        "anchorTensor",
        "appendToLocationExcludes",
        "autoRoundNumIPUs",
        "broadcastBuffers",
        "clone",
        "connectionType",
        "defaultAnchorMode",
        "defaultOutputMode",
        "deviceIterations",
        "disableModuleNamescope",
        "enableExecutableCaching",
        "enableProfiling",
        "enableStableNorm",
        "enableSyntheticData",
        "exists",
        "from_json",
        "inputReplicaGrouping",
        "loadFromFile",
        "logCycleCount",
        "logDir",
        "maxRepeatLogs",
        "modelName",
        "outputMode",
        "randomSeed",
        "relaxOptimizerAttributesChecks",
        "replicationFactor",
        "setAvailableMemoryProportion",
        "setExecutionStrategy",
        "showCompilationProgressBar",
        "sourceLocationExcludes",
        "syncPattern",
        "toDict",
        "updatableNamedBuffers",
        "useIpuId",
        "useIpuModel",
        "useOfflineIpuTarget",
    ),
    "Training": (
        "accumulationAndReplicationReductionType",
        "gradientAccumulation",
        "setAutomaticLossScaling",
        "setConvolutionDithering",
        "setMeanAccumulationAndReplicationReductionStrategy",
    ),
    "Distributed": ("configureProcessId", "disable", "numProcesses", "processId", "setEnvVarNames"),
    "TensorLocations": (
        "numIOTiles",
        "setAccumulatorLocation",
        "setActivationLocation",
        "setOptimizerLocation",
        "setWeightLocation",
    ),
    "Jit": ("traceModel",),
    "Precision": (
        "enableFloatingPointExceptions",
        "enableStochasticRounding",
        "halfFloatCasting",
        "runningStatisticsAlwaysFloat",
        "setPartialsType",
    ),
    "_Popart": ("set", "setEngineOptions", "setPatterns"),
}

#: ``PoplarExecutor`` methods and properties (PopTorch 3), on ``trainingModel(...)``.
POPTORCH_EXECUTOR_METHODS: tuple[str, ...] = (
    "attachToDevice",
    "compilationTime",
    "compile",
    "compileAndExport",
    "copyNamedBuffersToDevice",
    "copyWeightsToDevice",
    "copyWeightsToHost",
    "copyWeightsToHostIfNeeded",
    "cycleCount",
    "destroy",
    "detachFromDevice",
    "getAnchoredTensor",
    "getComputeLatency",
    "getHostIpuLatency",
    "getIpuHostLatency",
    "getLatency",
    "getPerfCounters",
    "getTensorNames",
    "isAttachedToDevice",
    "isCompiled",
    "loadExecutable",
    "load_state_dict",
    "model",
    "options",
    "rng_state",
    "save",
    "setOptimizer",
)

#: ``TensorLocationSettings`` methods (PopTorch 3).
POPTORCH_TENSOR_LOCATION_METHODS: tuple[str, ...] = (
    "minElementsForOffChip",
    "minElementsForReplicatedTensorSharding",
    "useIOTilesToLoad",
    "useIOTilesToStore",
    "useOnChipStorage",
    "useReplicatedTensorSharding",
)
