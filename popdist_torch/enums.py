"""PopTorch's enumerations, with PopTorch's names and integer values."""

from __future__ import annotations

import enum

__all__ = ["DataLoaderMode", "MeanReductionStrategy", "OutputMode", "ReductionType"]


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
