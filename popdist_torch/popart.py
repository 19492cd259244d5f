"""A stand-in for ``popart`` as PopTorch programs use it: ``import popdist_torch.popart as popart``.

PopTorch programs import PopART for its enumerations and pass them, as integers, to
``opts._Popart.set(key, value)`` (``int(popart.RecomputationType.Pipeline)``), or build a few
settings objects. There is no PopART session here, so this module offers exactly those
names, with PopART's members and integer values, and settings objects that keep what they
are given; nothing in it changes how the executor runs. It is not PopART's graph API
(``Builder``, ``TrainingSession``...): a program that builds PopART graphs has nothing to run
here.

:data:`KNOWN_OPTIONS` is the set of session option names (PopART's ``SessionOptions`` fields
and the keys PopTorch itself passes) that ``opts._Popart.set`` accepts silently; other keys
are recorded too, with a warning, since they are most likely typos.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Final

# PopART's enumerations whose members and values PopTorch's namesakes share: the same objects.
from popdist_torch.enums import ConnectionType as DeviceConnectionType
from popdist_torch.enums import ReductionType, SyncPattern

__all__ = [
    "KNOWN_OPTIONS",
    "AccumulateOuterFragmentSchedule",
    "AccumulateOuterFragmentSettings",
    "AnchorReturnTypeId",
    "AutomaticLossScalingSettings",
    "BatchSerializationBatchSchedule",
    "BatchSerializationMethod",
    "BatchSerializationSettings",
    "BatchSerializationTransformContext",
    "DataType",
    "DeviceConnectionType",
    "ExecutionPhaseIOSchedule",
    "ExecutionPhaseSchedule",
    "ExecutionPhaseSettings",
    "Instrumentation",
    "IrSerializationFormat",
    "MeanReductionStrategy",
    "MergeVarUpdateType",
    "Patterns",
    "PatternsLevel",
    "RecomputationType",
    "RecomputeType",
    "ReductionType",
    "ReplicatedTensorSharding",
    "SessionOptions",
    "SubgraphCopyingStrategy",
    "SyncPattern",
    "SyntheticDataMode",
    "TensorLocation",
    "TensorLocationSettings",
    "TensorStorage",
    "TileSet",
    "VirtualGraphMode",
    "getLogger",
    "is_known_option",
    "versionString",
]

#: The PopART release whose names and values this module follows.
__version__: Final = "3.3.0"


def versionString() -> str:
    """The PopART version these names follow."""
    return __version__


# -- enumerations (PopART's members and integer values) ----------------------------------


class SyntheticDataMode(enum.IntEnum):
    """Where input data comes from (``syntheticDataMode``)."""

    Off = 0
    Zeros = 1
    RandomNormal = 2
    RandomUniform = 3


class RecomputationType(enum.IntEnum):
    """Which activations PopART recomputes (``autoRecomputation``)."""

    NoRecompute = 0
    Standard = 1
    NormOnly = 2
    Pipeline = 3
    RecomputeAll = 4


class RecomputeType(enum.IntEnum):
    """How one operation takes part in recomputation."""

    Undefined = 0
    Checkpoint = 1
    Recompute = 2
    Recomputed = 3


class MergeVarUpdateType(enum.IntEnum):
    """Which weight updates PopART merges (``mergeVarUpdate``)."""

    Off = 0
    All = 1
    AutoLoose = 2
    AutoTight = 3


class VirtualGraphMode(enum.IntEnum):
    """How operations are placed on IPUs (``virtualGraphMode``)."""

    Off = 0
    Manual = 1
    Auto = 2
    ExecutionPhases = 3


class AccumulateOuterFragmentSchedule(enum.IntEnum):
    """Schedule of the gradient-accumulation outer fragment."""

    Scheduler = 0
    Serial = 1
    OverlapCycleOptimized = 2
    OverlapMemoryOptimized = 3


class SubgraphCopyingStrategy(enum.IntEnum):
    """When subgraph inputs and outputs are copied (``subgraphCopyingStrategy``)."""

    OnEnterAndExit = 0
    JustInTime = 1


class MeanReductionStrategy(enum.IntEnum):
    """When a mean reduction divides."""

    Running = 0
    Post = 1


class BatchSerializationTransformContext(enum.IntEnum):
    """When batch serialisation applies (``Forward``/``Backward`` are PopART's aliases)."""

    Fwd = 0
    Bwd = 1
    Forward = 0
    Backward = 1


class BatchSerializationMethod(enum.IntEnum):
    """How a batch is serialised."""

    UnrollDynamic = 0
    UnrollStatic = 1
    Loop = 2


class BatchSerializationBatchSchedule(enum.IntEnum):
    """How serialised batches are scheduled."""

    Scheduler = 0
    Isomorphic = 1
    OverlapOnIo = 2
    OverlapOnCompute = 3


class ExecutionPhaseIOSchedule(enum.IntEnum):
    """When tensors of an execution phase are loaded."""

    Preload = 0
    OnDemand = 1


class ExecutionPhaseSchedule(enum.IntEnum):
    """Order of the optimizer steps in an execution phase."""

    Interleaving = 0
    Batch = 1
    BatchClusteredIO = 2


class TensorStorage(enum.IntEnum):
    """Where a tensor is stored."""

    OnChip = 0
    OffChip = 1


class TileSet(enum.IntEnum):
    """Which tiles hold a tensor."""

    Compute = 0
    IO = 1
    Undefined = 2


class ReplicatedTensorSharding(enum.IntEnum):
    """Whether a tensor is sharded over replicas."""

    Off = 0
    On = 1


class PatternsLevel(enum.IntEnum):
    """Which graph patterns run."""

    NoPatterns = 0
    Minimal = 1
    Default = 2
    All = 3


class DataType(enum.IntEnum):
    """PopART's tensor element types."""

    UINT8 = 0
    INT8 = 1
    FLOAT8_143 = 2
    FLOAT8_152 = 3
    UINT16 = 4
    INT16 = 5
    INT32 = 6
    INT64 = 7
    UINT32 = 8
    UINT64 = 9
    BOOL = 10
    FLOAT = 11
    FLOAT16 = 12
    BFLOAT16 = 13
    DOUBLE = 14
    COMPLEX64 = 15
    COMPLEX128 = 16
    STRING = 17
    UNDEFINED = 18


class Instrumentation(enum.IntEnum):
    """Where cycle counters are placed (``hardwareInstrumentations``)."""

    Outer = 0
    Inner = 1


class IrSerializationFormat(enum.IntEnum):
    """Format of a serialised PopART IR."""

    JSON = 0


class AnchorReturnTypeId(enum.IntEnum):
    """Which values of an anchored tensor are returned (PopTorch's ``OutputMode``)."""

    Final = 0
    EveryN = 1
    All = 2
    Sum = 3


# -- settings objects: they keep what they are given --------------------------------------


@dataclass
class TensorLocation:
    """Where a class of tensors lives: ``TensorLocation(TensorStorage.OffChip)``...

    PopART's forms are ``(storage)``, ``(storage, replicatedTensorSharding)`` and
    ``(storage, loadTileSet, storageTileSet, replicatedTensorSharding)``.
    """

    storage: TensorStorage = TensorStorage.OnChip
    loadTileSet: Any = TileSet.Compute
    storageTileSet: TileSet = TileSet.Compute
    replicatedTensorSharding: ReplicatedTensorSharding = ReplicatedTensorSharding.Off

    def __post_init__(self) -> None:
        if isinstance(self.loadTileSet, ReplicatedTensorSharding):  # (storage, rts)
            self.replicatedTensorSharding, self.loadTileSet = self.loadTileSet, TileSet.Compute


@dataclass
class TensorLocationSettings:
    """Where a class of tensors lives, and from which size (``TensorLocationSettings(loc)``)."""

    location: Any = field(default_factory=TensorLocation)
    minElementsForOffChip: int = 2
    minElementsForReplicatedTensorSharding: int = 8192

    def __post_init__(self) -> None:
        if isinstance(self.location, TensorStorage):
            self.location = TensorLocation(self.location)


@dataclass
class AccumulateOuterFragmentSettings:
    """``accumulateOuterFragmentSettings``: schedule and excluded virtual graphs."""

    schedule: AccumulateOuterFragmentSchedule = AccumulateOuterFragmentSchedule.Serial
    excludedVirtualGraphs: list[int] = field(default_factory=list)


@dataclass
class BatchSerializationSettings:
    """``batchSerializationSettings``."""

    factor: int = 0
    concatOnVirtualGraphChange: bool = True
    concatOnExecutionPhaseChange: bool = True
    concatOnPipelineStageChange: bool = True
    transformContext: BatchSerializationTransformContext = BatchSerializationTransformContext.Fwd
    method: BatchSerializationMethod = BatchSerializationMethod.UnrollDynamic
    batchSchedule: BatchSerializationBatchSchedule = BatchSerializationBatchSchedule.Isomorphic


@dataclass
class ExecutionPhaseSettings:
    """``executionPhaseSettings``."""

    phases: int = 0
    stages: int = 2
    weightIOSchedule: ExecutionPhaseIOSchedule = ExecutionPhaseIOSchedule.Preload
    activationIOSchedule: ExecutionPhaseIOSchedule = ExecutionPhaseIOSchedule.Preload
    optimizerStateIOSchedule: ExecutionPhaseIOSchedule = ExecutionPhaseIOSchedule.OnDemand
    accumulatorIOSchedule: ExecutionPhaseIOSchedule = ExecutionPhaseIOSchedule.Preload
    schedule: ExecutionPhaseSchedule = ExecutionPhaseSchedule.Interleaving


@dataclass
class AutomaticLossScalingSettings:
    """``automaticLossScalingSettings``."""

    enabled: bool = False
    toTrackTensors: list[str] | None = None
    binEdgeLocation: float = 0.125
    thresholdUpperCountProportion: float = 1e-7
    updatePeriod: int = 1


class Patterns:
    """PopART's graph patterns: a level or a list of names, then ``enablePattern`` calls."""

    def __init__(self, level: PatternsLevel | list[str] = PatternsLevel.Default) -> None:
        self.level = level if isinstance(level, PatternsLevel) else None
        self.patterns: dict[str, bool] = (
            {} if isinstance(level, PatternsLevel) else dict.fromkeys(level, True)
        )

    def enablePattern(self, name: str, enabled: bool) -> Patterns:
        """Turn one pattern on or off (kept; there are no patterns to run)."""
        self.patterns[str(name)] = bool(enabled)
        return self

    def isPatternEnabled(self, name: str) -> bool:
        """What ``enablePattern`` last said for ``name`` (``False`` if never named)."""
        return self.patterns.get(name, False)


class SessionOptions:
    """PopART's session options as an attribute bag: known fields read their default.

    Assigning a field keeps it (``opts.enableOutlining = False``); a name that is not a
    session option raises ``AttributeError``, as PopART's object does.
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_values", {})

    def __getattr__(self, name: str) -> Any:
        values: dict[str, Any] = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        if name in _DEFAULTS:
            return _DEFAULTS[name]
        raise AttributeError(f"popart.SessionOptions has no option {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in KNOWN_OPTIONS:
            raise AttributeError(f"popart.SessionOptions has no option {name!r}")
        self._values[name] = value

    def toDict(self) -> dict[str, Any]:
        """The options assigned so far, by name."""
        return dict(self._values)


class _Logger:
    """PopART's logger: the level is kept; PopART logs nothing here."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.level = "OFF"

    def setLevel(self, level: str) -> None:
        """Keep ``level`` (``"TRACE"``, ``"DEBUG"``, ``"INFO"``, ``"WARN"``, ``"ERR"``, ``"OFF"``)."""
        self.level = str(level)


_loggers: dict[str, _Logger] = {}


def getLogger(name: str = "all") -> _Logger:
    """PopART's logger of ``name`` (there is nothing to log; its level is kept)."""
    return _loggers.setdefault(name, _Logger(name))


# -- session option names ------------------------------------------------------------------

#: The defaults of the session options programs read back most (the others read ``None``).
_DEFAULTS: dict[str, Any] = {
    "autoRecomputation": RecomputationType.NoRecompute,
    "mergeVarUpdate": MergeVarUpdateType.Off,
    "virtualGraphMode": VirtualGraphMode.Off,
    "syntheticDataMode": SyntheticDataMode.Off,
    "enableOutlining": True,
    "enablePipelining": False,
    "enableReplicatedGraphs": False,
    "enableGradientAccumulation": False,
    "enableStochasticRounding": False,
    "enableFloatingPointChecks": False,
    "enableStableNorm": False,
    "replicatedGraphCount": 1,
    "accumulationFactor": 1,
    "defaultPrefetchBufferingDepth": 1,
    "engineOptions": {},
    "convolutionOptions": {},
    "matmulOptions": {},
}

#: PopART's ``SessionOptions`` fields and the keys PopTorch passes to its session itself.
_FIELDS = """
    accumulateOuterFragmentSettings accumulationAndReplicationReductionType accumulationFactor
    accumulatorTensorLocationSettings activationTensorLocationSettings aliasZeroCopy
    autoRecomputation autodiffSettings automaticLossScalingSettings batchSerializationSettings
    bufferingDepthMap cachePath compilationProgressTotal compileEngine constantWeights
    convolutionOptions createHostTransferableTensorWithOffset
    createImplicitPipeliningFwdOnlyProgram customCodeletCompileFlags customCodelets
    decomposeGradSum defaultBufferingDepth defaultPrefetchBufferingDepth delayVarUpdates
    developerSettings disableGradAccumulationTensorStreams disableOptimizerStateTensorStreams
    dotChecks dotOpNames enableConstantFoldingOfMultipleConsumers
    enableDistributedReplicatedGraphs enableEfficientOverlapIOTopoCons enableEngineCaching
    enableExplicitIR enableExplicitMainLoops enableFloatingPointChecks enableFullyConnectedPass
    enableGradientAccumulation enableInplaceAmbiguityChecking enableLoadAndOffloadRNGState
    enableMergeExchange enableNonStableSoftmax enableOutlining enableOutliningCopyCostPruning
    enablePipelining enablePrefetchDatastreams enableReplicatedGraphs enableSerializedMatmuls
    enableStableNorm enableStochasticRounding enableSupportedDataTypeCasting
    enableVariablesCaching engineOptions ensureFp32LossScaleTensor executionPhaseSettings
    experimentalSettings explicitRecomputation exportPoplarComputationGraph
    exportPoplarVertexGraph finalDotOp firstDotOp gclOptions globalReplicaOffset
    globalReplicationFactor groupHostSync groupNormStridedChannelGrouping
    hardwareInstrumentations instrumentWithHardwareCycleCounter kahnTieBreaker logDir
    looseThresholdAtPeak lstmOptions matmulOptions meanAccumulationAndReplicationReductionStrategy
    mergeVarUpdate mergeVarUpdateMemThreshold numIOTiles opxAliasChecking opxModifyChecking
    optimizerStateTensorLocationSettings outlineSequenceBreakCost outlineThreshold
    partialsTypeMatMuls patterns patterns_level prefetchBufferingDepthMap rearrangeAnchorsOnHost
    rearrangeStreamsOnHost replicatedCollectivesSettings replicatedGraphCount reportOptions
    saveInitializersToFile scheduleNonWeightUpdateGradientConsumersEarly separateCallOpPdfs
    serializedPoprithmsShiftGraphsDir stashAllTensorsInferencePipeline strictOpVersions
    subgraphCopyingStrategy swapLimitScheduler syntheticDataMode
    tensorLocationSettingsOverride throwIfLog2ScaleTensorNotInRange timeLimitScheduler
    updatableNamedBuffers useHostCopyOps useLoopCandidateCreator virtualGraphMode
    virtualGraphSplitRatios weightTensorLocationSettings
"""

#: Fields that are structures: ``"<field>.<member>"`` keys (``"executionPhaseSettings.phases"``).
_STRUCTURES = frozenset(
    {
        "accumulateOuterFragmentSettings",
        "accumulatorTensorLocationSettings",
        "activationTensorLocationSettings",
        "autodiffSettings",
        "automaticLossScalingSettings",
        "batchSerializationSettings",
        "developerSettings",
        "executionPhaseSettings",
        "experimentalSettings",
        "optimizerStateTensorLocationSettings",
        "replicatedCollectivesSettings",
        "weightTensorLocationSettings",
    }
)

#: Every session option name ``opts._Popart.set`` accepts without a warning.
KNOWN_OPTIONS: Final[frozenset[str]] = frozenset(_FIELDS.split())


def is_known_option(key: str) -> bool:
    """Whether ``key`` names a session option (``"a.b"``: member ``b`` of structure ``a``)."""
    head, dot, member = key.partition(".")
    if dot:
        return head in _STRUCTURES and bool(member)
    return key in KNOWN_OPTIONS
