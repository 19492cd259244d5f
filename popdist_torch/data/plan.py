"""What a ``DataLoader``'s arguments mean, as a frozen description computed once.

:class:`LoaderPlan` is the batch arithmetic (micro-batch, combined batch, worker batches
per combined batch), the process's place (its id among how many, whether the loader shards
for it), where the samples come from (:attr:`LoaderPlan.source`) and the epoch's length. It
is built once by :func:`popdist_torch.data.arguments.make_plan` and never written: the
epoch's order (:mod:`popdist_torch.data.epoch_order`) and the loader's position
(:mod:`popdist_torch.data.loader`) are computed from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Protocol

from popdist_torch.enums import DataLoaderMode

__all__ = [
    "DEFAULT_BUFFER_SIZE",
    "ORDERS",
    "ORDER_POPTORCH",
    "ORDER_TOPOLOGY_INVARIANT",
    "SAMPLED",
    "SOURCES",
    "LoaderOptions",
    "LoaderPlan",
]

#: Values of the ``order`` argument.
ORDER_POPTORCH = "poptorch"
ORDER_TOPOLOGY_INVARIANT = "topology_invariant"
ORDERS = (ORDER_POPTORCH, ORDER_TOPOLOGY_INVARIANT)

#: Combined batches an asynchronous loader keeps ready (``async_options["buffer_size"]``).
DEFAULT_BUFFER_SIZE = 3

#: Where samples come from: this instance's indices of each epoch (a map-style dataset),
#: this instance's part of each epoch of the user's ``sampler`` (automatic partitioning over
#: several processes, or the topology-invariant order), the user's micro-batches combined
#: and dealt (``batch_sampler``), a sharded ``IterableDataset``, the user's own ``sampler``
#: as it is (one process), or the dataset's items unbatched.
BY_INDEX: Final = "by_index"
SAMPLED: Final = "sampled"
BATCH_SAMPLER: Final = "batch_sampler"
STREAM: Final = "stream"
USER_SAMPLER: Final = "user_sampler"
UNBATCHED: Final = "unbatched"
SOURCES = (BY_INDEX, SAMPLED, BATCH_SAMPLER, STREAM, USER_SAMPLER, UNBATCHED)


class LoaderOptions(Protocol):
    """The part of ``popdist_torch.Options`` the loader reads."""

    @property
    def device_iterations(self) -> int: ...
    @property
    def replication_factor(self) -> int: ...
    @property
    def random_seed(self) -> int | None: ...
    @property
    def Training(self) -> Any: ...  # PopTorch's name
    @property
    def Distributed(self) -> Any: ...  # PopTorch's name


@dataclass(frozen=True)
class LoaderPlan:
    """A DataLoader's arguments, worked out: what every epoch and every batch is made of.

    ``topology``: (device iterations, local replicas, gradient accumulation).
    ``combined``: samples per combined batch (``None`` without a micro-batch size).
    ``worker_batch``: the batch size torch loads, ``group`` of which make one combined batch
    (``AsyncRebatched``). ``epoch_length``: this instance's samples per epoch, when it
    chooses samples by index. ``replica_counts``: a non-uniform split's local replicas per
    process (the combined batch then differs between processes).
    """

    mode: DataLoaderMode
    order: str
    shuffle: bool
    auto: bool
    drop_last: bool
    process_id: int
    num_processes: int
    topology: tuple[int, int, int]
    batch_size: int | None
    source: str
    combined: int | None = None
    worker_batch: int | None = None
    group: int = 1
    depth: int = DEFAULT_BUFFER_SIZE
    private_generator: bool = True
    num_samples: int | None = None
    epoch_length: int | None = None
    #: Every process's local replicas when the split is not uniform (``None``: uniform).
    replica_counts: tuple[int, ...] | None = None
    #: ``SAMPLED``: the user's sampler draws its order from a ``generator`` it was not given,
    #: which the loader gives it each epoch, seeded from the shuffle seed and the epoch.
    seeds_sampler: bool = False

    @property
    def micro_batches(self) -> int:
        """Micro-batches per combined batch: device iterations × local replicas × accumulation."""
        di, r, ga = self.topology
        return di * r * ga

    @property
    def processes(self) -> int:
        """Processes the loader shards over (1 with ``auto_distributed_partitioning=False``)."""
        return self.num_processes if self.auto else 1

    @property
    def shard_id(self) -> int:
        """This process's shard among :attr:`processes`."""
        return self.process_id if self.auto else 0

    @property
    def by_index(self) -> bool:
        """Whether each epoch's samples are this instance's indices, chosen here."""
        return self.source in (BY_INDEX, SAMPLED)

    def combined_sizes(self) -> tuple[int, ...]:
        """Every process's combined batch, in process order (they differ on a non-uniform split)."""
        assert self.combined is not None and self.batch_size is not None
        if self.replica_counts is None or not self.auto:
            return (self.combined,) * self.processes
        di, _, ga = self.topology
        return tuple(self.batch_size * di * ga * count for count in self.replica_counts)
