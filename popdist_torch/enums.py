"""PopTorch's enumerations, with PopTorch's names and integer values."""

from __future__ import annotations

import enum

__all__ = [
    "AnchorMode",
    "AutoStage",
    "CommGroupType",
    "ConnectionType",
    "DataLoaderMode",
    "HalfFloatCastingBehavior",
    "Liveness",
    "MatMulSerializationMode",
    "MeanReductionStrategy",
    "MultiConvPlanType",
    "OutputMode",
    "OverlapMode",
    "ReductionType",
    "SharingStrategy",
    "SyncPattern",
    "VariableRetrievalMode",
]


class OutputMode(enum.IntEnum):
    """Which outputs a model call returns to the caller.

    ``Final``: the last micro-batch's; ``EveryN``: every N-th device iteration's
    (``Options.outputMode(EveryN, output_return_period=N)``); ``All``: every
    micro-batch's; ``Sum``: the sum over all micro-batches; ``Default``: ``Final`` for a
    training model, ``All`` for an inference model.
    """

    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class ReductionType(enum.IntEnum):
    """How gradients (and ``identity_loss``) combine over samples, steps and replicas."""

    Sum = 0
    Mean = 1
    NoReduction = 2


class DataLoaderMode(enum.IntEnum):
    """How a ``DataLoader`` produces batches: in the caller, or in a worker process."""

    Sync = 0
    Async = 1
    AsyncRebatched = 2


class MeanReductionStrategy(enum.IntEnum):
    """When a Mean reduction divides: on the fly (``Running``), after summing (``Post``).

    Kept for PopTorch compatibility: both give the same result here up to rounding, and
    the executor always divides once, after summing (``Post``).
    """

    Running = 0
    Post = 1
    Sum = 2
    PostAndLoss = 2  # PopTorch 3's name of the value 2


class AnchorMode(enum.IntEnum):
    """PopTorch's old name of :class:`OutputMode` (deprecated there in 2.4, kept as an alias).

    ``Options.anchorMode`` accepts it and warns; new code uses ``OutputMode``.
    """

    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class AutoStage(enum.IntEnum):
    """How blocks become stages when a strategy lists no stages.

    ``SameAsIpu``: the blocks on one ``ipu_id`` form one stage (the stage id is the
    ipu id; PopTorch's default).  ``AutoIncrement``: every block is a stage of its own.
    """

    SameAsIpu = 0
    AutoIncrement = 1


class ConnectionType(enum.IntEnum):
    """When PopTorch attaches to hardware; accepted, no effect here (no device to attach)."""

    Always = 0
    OnDemand = 1
    Never = 2


class SyncPattern(enum.IntEnum):
    """PopTorch's host/device sync pattern; accepted, no effect here."""

    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class HalfFloatCastingBehavior(enum.IntEnum):
    """PopTorch's float16/float32 casting rule; accepted, torch's own promotion applies."""

    FloatDowncastToHalf = 0
    HalfUpcastToFloat = 1
    Default = 2


class SharingStrategy(enum.IntEnum):
    """How an asynchronous DataLoader's workers share tensors with the caller."""

    SharedMemory = 0
    FileSystem = 1
    Fork = 2
    ForkServer = 3


class MatMulSerializationMode(enum.Enum):
    """How ``serializedMatMul`` splits a product on an IPU; torch computes it whole."""

    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


class Liveness(enum.IntEnum):
    """Where phased execution keeps tensors between phases; accepted, no effect here."""

    AlwaysLive = 0
    OffChipAfterFwd = 1
    OffChipAfterFwdNoOverlap = 2
    OffChipAfterEachPhase = 3


class OverlapMode(enum.Enum):
    """PopTorch's host-I/O overlap of IO tiles; accepted, no effect here."""

    NoOverlap = "no_overlap"
    OverlapAccumulationLoop = "overlap_accumulation_loop"
    OverlapDeviceIterationLoop = "overlap_device_iteration_loop"


class MultiConvPlanType(enum.IntEnum):
    """How PopTorch plans the convolutions of a ``MultiConv``; accepted, no effect here."""

    Parallel = 0
    Serial = 1


class CommGroupType(enum.IntEnum):
    """Replica grouping of PopTorch's replica-grouped variables (not supported here)."""

    All = 0
    Consecutive = 1
    Orthogonal = 2
    NoGrouping = 3


class VariableRetrievalMode(enum.IntEnum):
    """Which replica's copy of a grouped variable to read back (not supported here)."""

    OnePerGroup = 0
    AllReplicas = 2
