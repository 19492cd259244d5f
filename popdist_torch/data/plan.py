"""What a ``DataLoader``'s arguments mean: the batch arithmetic, shards, samplers and seeds.

:class:`LoaderPlan` turns PopTorch's DataLoader arguments into torch's: the combined batch
size, this process's shard (a sampler over the epoch's index list, a combining batch
sampler over the user's micro-batches, or a sharded IterableDataset) and the seeds of the
epoch order. :mod:`popdist_torch.dataloader` iterates; this module decides what.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Iterable, Iterator, Sized
from typing import Any, Protocol

import torch
from torch.utils import data as tud

from popdist import sharding
from popdist_torch.enums import DataLoaderMode
from popdist_torch.errors import DataLoaderError

__all__ = [
    "ASYNC_OPTION_KEYS",
    "DEFAULT_BUFFER_SIZE",
    "ORDERS",
    "ORDER_POPTORCH",
    "ORDER_TOPOLOGY_INVARIANT",
    "CombiningBatchSampler",
    "EpochSampler",
    "LoaderOptions",
    "LoaderPlan",
    "ShardedIterable",
    "check_batch_size",
    "current_shard",
]

#: Values of the ``order`` argument.
ORDER_POPTORCH = "poptorch"
ORDER_TOPOLOGY_INVARIANT = "topology_invariant"
ORDERS = (ORDER_POPTORCH, ORDER_TOPOLOGY_INVARIANT)

#: ``async_options`` keys: ``buffer_size`` is honoured; the others are PopTorch knobs of
#: its shared-memory ring buffer that have no meaning for a thread-and-queue prefetcher.
ASYNC_OPTION_KEYS = frozenset(
    {
        "buffer_size",
        "miss_sleep_time_in_ms",
        "load_indefinitely",
        "early_preload",
        "sharing_strategy",
    }
)
DEFAULT_BUFFER_SIZE = 3


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


_shard_local = threading.local()


def current_shard() -> tuple[int, int]:
    """``(shard_index, num_shards)`` of the IterableDataset stream being read right now.

    Call it inside your ``IterableDataset.__iter__`` when the loader was built with
    ``auto_distributed_partitioning=False``: yield only the samples ``i`` with
    ``i % num_shards == shard_index``, or read only that part of your files. The shard
    accounts for the instance and for torch's worker process. Outside a loader's
    iteration it is ``(0, 1)``.
    """
    shard: tuple[int, int] | None = getattr(_shard_local, "shard", None)
    return shard if shard is not None else (0, 1)


class EpochSampler(tud.Sampler[int]):
    """Yields the index list the loader computed for the current epoch."""

    def __init__(self, length: int) -> None:
        self.indices: list[int] = []
        self.length = length  # a full epoch's samples, even when resuming mid-epoch

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.length


class CombiningBatchSampler(tud.Sampler[list[int]]):
    """Groups a user's micro-batches into combined batches and deals them to processes.

    Every process runs the user's batch sampler in full (it must yield the same sequence
    everywhere); consecutive groups of ``per_combined`` micro-batches form combined
    batches, dealt round-robin: group ``g`` belongs to process ``g % num_processes``.
    With ``drop_last`` a round of groups is used only when complete, so every process
    yields the same number of batches.
    """

    def __init__(
        self,
        batch_sampler: Iterable[list[int]],
        per_combined: int,
        num_processes: int,
        process_id: int,
        drop_last: bool,
    ) -> None:
        self.batch_sampler = batch_sampler
        self.per_combined = per_combined
        self.num_processes = num_processes
        self.process_id = process_id
        self.drop_last = drop_last
        self.skip = 0

    def _groups(self) -> Iterator[list[list[int]]]:
        group: list[list[int]] = []
        for micro in self.batch_sampler:
            group.append(list(micro))
            if len(group) == self.per_combined:
                yield group
                group = []
        if group and not self.drop_last:
            yield group

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        round_: list[list[list[int]]] = []
        mine = 0
        for group in self._groups():
            round_.append(group)
            if len(round_) < self.num_processes:
                continue
            own, round_ = round_[self.process_id], []
            mine += 1
            if mine > skip:
                yield join_micro_batches(own)
        if round_ and not self.drop_last and len(round_) > self.process_id:
            mine += 1
            if mine > skip:
                yield join_micro_batches(round_[self.process_id])

    def __len__(self) -> int:
        if not isinstance(self.batch_sampler, Sized):
            raise TypeError("the batch_sampler has no len(), so neither has this DataLoader")
        micro = len(self.batch_sampler)
        groups = micro // self.per_combined
        if not self.drop_last:
            groups = math.ceil(micro / self.per_combined)
            return groups // self.num_processes + (groups % self.num_processes > self.process_id)
        return groups // self.num_processes


def join_micro_batches(group: list[list[int]]) -> list[int]:
    sizes = {len(m) for m in group}
    if len(sizes) > 1:
        raise DataLoaderError(
            f"batch_sampler yielded micro-batches of sizes {sorted(sizes)} within one "
            "combined batch: every micro-batch of a combined batch must have the same size, "
            "since the combined batch is split evenly between replicas and steps"
        )
    return [i for micro in group for i in micro]


class ShardedIterable(tud.IterableDataset[Any]):
    """Streams one instance-and-worker shard of a user's IterableDataset."""

    def __init__(self, dataset: Any, process_id: int, num_processes: int, auto: bool) -> None:
        self.dataset = dataset
        self.process_id = process_id
        self.num_processes = num_processes
        self.auto = auto

    def _shard(self) -> tuple[int, int]:
        info = tud.get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return sharding.worker_shard(self.process_id, self.num_processes, worker_id, num_workers)

    def __iter__(self) -> Iterator[Any]:
        index, count = self._shard()
        previous = getattr(_shard_local, "shard", None)
        _shard_local.shard = (index, count)
        try:
            stream = iter(self.dataset)
            if not self.auto or count == 1:
                yield from stream
                return
            cap = len(self.dataset) // count if isinstance(self.dataset, Sized) else None
            taken = 0
            for position, item in enumerate(stream):
                if position % count != index:
                    continue
                if cap is not None and taken >= cap:
                    return
                taken += 1
                yield item
        finally:
            _shard_local.shard = previous

    def __len__(self) -> int:
        if not isinstance(self.dataset, Sized):
            raise TypeError(f"{type(self.dataset).__name__} has no len()")
        if not self.auto:
            return len(self.dataset)
        return len(self.dataset) // self.num_processes


def check_batch_size(batch_size: object) -> None:
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DataLoaderError(
            f"DataLoader batch_size={batch_size!r} is invalid: it is the micro-batch size "
            "of one replica and must be a positive integer (e.g. batch_size=1)"
        )


class LoaderPlan:
    """What a DataLoader's arguments mean: batch arithmetic, shards, samplers, seeds.

    Built once by :class:`~popdist_torch.dataloader.DataLoader`, which hands torch
    :attr:`dataset` and :attr:`torch_kwargs`. Every argument is validated here, with a
    message naming it, before torch sees any of them.
    """

    def __init__(
        self,
        options: LoaderOptions,
        dataset: Any,
        *,
        batch_size: int | None,
        shuffle: bool,
        num_workers: int,
        drop_last: bool,
        persistent_workers: bool | None,
        auto_distributed_partitioning: bool,
        mode: DataLoaderMode,
        async_options: dict[str, Any] | None,
        rebatched_worker_size: int | None,
        batch_sampler: Iterable[list[int]] | None,
        order: str,
        kwargs: dict[str, Any],
    ) -> None:
        check_batch_size(batch_size)
        if order not in ORDERS:
            raise DataLoaderError(f"DataLoader order={order!r} is invalid: use one of {ORDERS}")
        self.mode = DataLoaderMode(mode)
        self.order = order
        self.shuffle = bool(shuffle)
        self.auto = auto_distributed_partitioning
        self.drop_last = drop_last
        self._topology_from(options)
        self.seed: int | None = options.random_seed
        self.batch_size = batch_size
        self.sampler: EpochSampler | None = None
        self.combining: CombiningBatchSampler | None = None
        self.num_samples: int | None = None
        self.combined: int | None = None
        self.group = 1  # worker batches per combined batch (AsyncRebatched)
        self.depth = DEFAULT_BUFFER_SIZE
        torch_kwargs = self._generator_for(kwargs)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        torch_kwargs.update(num_workers=num_workers, persistent_workers=persistent_workers)
        self._async_options, self._worker_size = async_options, rebatched_worker_size
        self.dataset = dataset  # what torch reads: an IterableDataset is wrapped in its shard
        if batch_sampler is not None:
            torch_kwargs.update(self._with_batch_sampler(batch_sampler, kwargs))
        elif batch_size is None:
            torch_kwargs.update(self._unbatched())
        else:
            torch_kwargs.update(self._batched(batch_size, kwargs))
        #: What torch's ``DataLoader.__init__`` is given besides :attr:`dataset`.
        self.torch_kwargs = torch_kwargs

    def _with_batch_sampler(
        self, batch_sampler: Iterable[list[int]], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """The user's micro-batches, combined and dealt to the processes here."""
        if self.batch_size != 1 or self.shuffle or kwargs.get("sampler") is not None:
            raise DataLoaderError(
                "DataLoader batch_sampler is mutually exclusive with batch_size, shuffle and "
                "sampler: each index list the batch_sampler yields is one micro-batch; "
                "leave batch_size=1 and shuffle=False"
            )
        processes = self.num_processes if self.auto else 1
        process_id = self.process_id if self.auto else 0
        self.combining = CombiningBatchSampler(
            batch_sampler, self.micro_batches, processes, process_id, self.drop_last
        )
        self._check_async()
        return {"batch_sampler": self.combining}

    def _unbatched(self) -> dict[str, Any]:
        """``batch_size=None``: the dataset's items as they are (no automatic partitioning)."""
        if self.auto:
            raise DataLoaderError(
                "DataLoader batch_size=None is only allowed with "
                "auto_distributed_partitioning=False: the loader needs a micro-batch "
                "size to build combined batches"
            )
        self._check_async()
        # No batches, nothing to drop.
        return {"batch_size": None, "shuffle": self.shuffle, "drop_last": False}

    def _batched(self, batch_size: int, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Combined batches of ``batch_size``-sample micro-batches from this process's shard."""
        di, r, ga = self.topology
        self.combined = sharding.combined_batch_size(batch_size, di, r, ga)
        worker_batch = self._check_async()
        shuffle = self.shuffle
        sampler: dict[str, Any] = {}
        if isinstance(self.dataset, tud.IterableDataset):
            if shuffle:
                raise DataLoaderError(
                    "DataLoader shuffle=True cannot shuffle an IterableDataset: shuffle "
                    "inside the dataset's __iter__ instead"
                )
            self.dataset = ShardedIterable(
                self.dataset, self.process_id, self.num_processes, self.auto
            )
        elif kwargs.get("sampler") is not None:
            if self.num_processes > 1 and self.auto:
                raise DataLoaderError(
                    "DataLoader(sampler=...) cannot be combined with automatic partitioning "
                    f"over {self.num_processes} processes: pass a batch_sampler (sharded "
                    "here), or auto_distributed_partitioning=False and shard it yourself"
                )
        else:
            self._setup_map_style(self.dataset)
            sampler, shuffle = {"sampler": self.sampler}, False
        return {
            "batch_size": worker_batch,
            "shuffle": shuffle,
            "drop_last": self.drop_last,
            **sampler,
        }

    def _topology_from(self, options: LoaderOptions) -> None:
        device_iterations = int(options.device_iterations)
        local_replicas = int(options.replication_factor) // int(
            getattr(options, "input_group_size", 1)
        )
        accumulation = int(options.Training.gradient_accumulation)
        self.process_id = int(options.Distributed.processId)
        self.num_processes = int(options.Distributed.numProcesses)
        self.micro_batches = device_iterations * local_replicas * accumulation
        self.topology = (device_iterations, local_replicas, accumulation)

    def _generator_for(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """torch's keyword arguments, with a private generator unless the user gave one.

        Torch draws its workers' base seed from this generator at every ``__iter__``; a
        private one, re-seeded per epoch, keeps the global generator untouched by
        iteration (so a resumed run continues the same random stream) and gives each
        instance's workers their own seeds.
        """
        torch_kwargs: dict[str, Any] = dict(kwargs)
        self.generator: torch.Generator | None = None
        self.worker_seed = self.seed
        if kwargs.get("generator") is None:
            self.generator = torch.Generator()
            torch_kwargs["generator"] = self.generator
            if self.worker_seed is None:
                self.worker_seed = int(torch.empty((), dtype=torch.int64).random_().item())
        return torch_kwargs

    def _check_async(self) -> int | None:
        """Validate the asynchronous options; returns the batch size torch should use."""
        self.depth, worker_batch = check_async(
            self.mode, self._async_options, self._worker_size, self.combined
        )
        if worker_batch is not None and self.combined is not None:
            self.group = self.combined // worker_batch
        return worker_batch

    def _setup_map_style(self, dataset: Any) -> None:
        shuffle, drop_last = self.shuffle, self.drop_last
        if not isinstance(dataset, Sized):
            raise DataLoaderError(
                f"DataLoader needs len(dataset): {type(dataset).__name__} has no __len__ "
                "(make it an IterableDataset to stream it)"
            )
        num_samples = len(dataset)
        combined = self.combined
        assert combined is not None
        processes = self.num_processes if self.auto else 1
        if shuffle and processes > 1 and self.seed is None:
            raise DataLoaderError(
                f"DataLoader shuffle=True with {processes} processes needs "
                "Options.randomSeed(...) so that every process shuffles the same way: "
                "call options.randomSeed(<int>) before building the DataLoader"
            )
        if num_samples == 0:
            raise DataLoaderError("DataLoader got an empty dataset (len(dataset) == 0)")
        b, (di, r, ga) = self.batch_size, self.topology
        needed = combined * processes
        if drop_last and num_samples < needed:
            raise DataLoaderError(
                f"DataLoader: the dataset of {num_samples} samples is smaller than one "
                f"combined batch per process ({combined} = batch_size {b} × deviceIterations "
                f"{di} × local replicas {r} × gradientAccumulation {ga}, × {processes} "
                f"processes = {needed}), so every epoch would be empty: use a smaller "
                "batch_size or fewer device iterations/replicas/accumulation steps, or "
                "drop_last=False"
            )
        if not drop_last and processes > 1 and num_samples < processes:
            raise DataLoaderError(
                f"DataLoader: the dataset of {num_samples} samples leaves some of the "
                f"{processes} processes without any sample: use a larger dataset or fewer "
                "instances"
            )
        if not drop_last and num_samples % needed:
            _warn_uneven(num_samples, combined, processes, self.process_id)
        self.num_samples = num_samples
        if processes > 1 or self.order == ORDER_TOPOLOGY_INVARIANT:
            if shuffle:
                self.draw_seed()
            length = len(self.epoch_indices(0))
        else:
            length = num_samples
        self.sampler = EpochSampler(length)

    def draw_seed(self) -> None:
        """Without ``randomSeed``, shuffle from torch's global generator, as torch does."""
        if self.seed is None:
            self.seed = int(torch.empty((), dtype=torch.int64).random_().item())

    def epoch_indices(self, epoch: int) -> list[int]:
        """This process's sample indices for ``epoch``, in the order they are loaded."""
        assert self.num_samples is not None and self.combined is not None
        n = self.num_samples
        processes = self.num_processes if self.auto else 1
        process_id = self.process_id if self.auto else 0
        seed = self.seed if self.shuffle else None
        if self.order == ORDER_TOPOLOGY_INVARIANT:
            di, r, ga = self.topology
            assert self.batch_size is not None
            return sharding.topology_invariant_indices(
                n,
                micro_batch_size=self.batch_size,
                device_iterations=di,
                gradient_accumulation=ga,
                local_replicas=r,
                num_processes=processes,
                process_id=process_id,
                shuffle=self.shuffle,
                seed=seed,
                epoch=epoch,
                drop_last=self.drop_last,
            )
        if processes > 1:
            return sharding.process_indices(
                n,
                self.combined,
                processes,
                process_id,
                drop_last=self.drop_last,
                shuffle=self.shuffle,
                seed=seed,
                epoch=epoch,
            )
        if self.shuffle:
            assert seed is not None
            return sharding.epoch_permutation(n, seed, epoch)
        return list(range(n))


def check_async(
    mode: DataLoaderMode,
    async_options: dict[str, Any] | None,
    worker_size: int | None,
    combined: int | None,
) -> tuple[int, int | None]:
    """The prefetch depth and the batch size torch should use, from the async arguments."""
    unknown = set(async_options or {}) - ASYNC_OPTION_KEYS
    if unknown:
        raise DataLoaderError(
            f"DataLoader async_options has unknown keys {sorted(unknown)}: "
            f"known keys are {sorted(ASYNC_OPTION_KEYS)}"
        )
    depth = (async_options or {}).get("buffer_size", DEFAULT_BUFFER_SIZE)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise DataLoaderError(
            f"DataLoader async_options['buffer_size']={depth!r} is invalid: "
            "use a positive integer (combined batches loaded ahead)"
        )
    if worker_size is None or combined is None:
        if worker_size is not None:
            raise DataLoaderError(
                "DataLoader rebatched_worker_size needs batch_size set and no batch_sampler"
            )
        return depth, combined
    if mode != DataLoaderMode.AsyncRebatched:
        raise DataLoaderError(
            f"DataLoader rebatched_worker_size={worker_size} only applies to "
            "mode=DataLoaderMode.AsyncRebatched"
        )
    if (
        isinstance(worker_size, bool)
        or not isinstance(worker_size, int)
        or worker_size < 1
        or combined % worker_size
    ):
        raise DataLoaderError(
            f"DataLoader rebatched_worker_size={worker_size!r} is invalid: it must be a "
            f"positive divisor of the combined batch size {combined}"
        )
    return depth, worker_size


def _warn_uneven(num_samples: int, combined: int, processes: int, process_id: int) -> None:
    """Warn that the last combined batch is short (and uneven across processes)."""
    per_process = [
        num_samples // processes + (num_samples % processes > p) for p in range(processes)
    ]
    last = per_process[process_id if processes > 1 else 0] % combined
    batches = {math.ceil(n / combined) for n in per_process}
    message = (
        f"DataLoader: {num_samples} samples are not a multiple of the combined batch "
        f"size {combined} × {processes} process(es): the last combined batch of this "
        f"process will have {last or combined} samples"
    )
    if len(batches) > 1:
        message += (
            f", and processes yield different numbers of batches {sorted(batches)} "
            "(collectives across instances would hang): use drop_last=True"
        )
    warnings.warn(message, stacklevel=6)  # the caller of DataLoader(...)
