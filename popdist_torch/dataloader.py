"""PopTorch's ``DataLoader`` on torch: combined batches, per-instance shards, prefetching.

One call of the loader yields one *combined batch*: ``batch_size × deviceIterations × local
replicas × gradientAccumulation`` samples, what one instance's model consumes per call.
With more than one process, each instance reads only its shard of a map-style dataset,
computed by :mod:`popdist.sharding` (PopTorch's order by default, a topology-invariant one
with ``order="topology_invariant"``). The index list of each epoch is computed in the main
process and fed to torch through a sampler, so worker processes always see the current
epoch's order and a checkpoint can resume mid-epoch without loading skipped samples.

Beyond PopTorch: a ``batch_sampler`` yields micro-batches that are combined and sharded
here; an ``IterableDataset`` is sharded by instance and worker; a dataset too small for
one combined batch is an error rather than an empty loader.
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any, Protocol

import torch
from torch.utils import data as tud

from popdist import sharding
from popdist_torch._async import Prefetcher, rebatch
from popdist_torch.enums import DataLoaderMode

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


class _Options(Protocol):
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


class _EpochSampler(tud.Sampler[int]):
    """Yields the index list the loader computed for the current epoch."""

    def __init__(self, length: int) -> None:
        self.indices: list[int] = []
        self.length = length  # a full epoch's samples, even when resuming mid-epoch

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.length


class _CombiningBatchSampler(tud.Sampler[list[int]]):
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
                yield _join_micro_batches(own)
        if round_ and not self.drop_last and len(round_) > self.process_id:
            mine += 1
            if mine > skip:
                yield _join_micro_batches(round_[self.process_id])

    def __len__(self) -> int:
        if not isinstance(self.batch_sampler, Sized):
            raise TypeError("the batch_sampler has no len(), so neither has this DataLoader")
        micro = len(self.batch_sampler)
        groups = micro // self.per_combined
        if not self.drop_last:
            groups = math.ceil(micro / self.per_combined)
            return groups // self.num_processes + (groups % self.num_processes > self.process_id)
        return groups // self.num_processes


def _join_micro_batches(group: list[list[int]]) -> list[int]:
    sizes = {len(m) for m in group}
    if len(sizes) > 1:
        raise ValueError(
            f"batch_sampler yielded micro-batches of sizes {sorted(sizes)} within one "
            "combined batch: every micro-batch of a combined batch must have the same size, "
            "since the combined batch is split evenly between replicas and steps"
        )
    return [i for micro in group for i in micro]


class _ShardedIterable(tud.IterableDataset[Any]):
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


def _check_batch_size(batch_size: object) -> None:
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"DataLoader batch_size={batch_size!r} is invalid: it is the micro-batch size "
            "of one replica and must be a positive integer (e.g. batch_size=1)"
        )


class DataLoader(tud.DataLoader[Any]):
    """PopTorch-compatible DataLoader; a ``torch.utils.data.DataLoader`` underneath.

    ``batch_size`` is the micro-batch size; each iteration yields one combined batch of
    :attr:`combinedBatchSize` samples. See ``docs/dataloader.md``.
    """

    def __init__(
        self,
        options: _Options,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = False,
        num_workers: int = 0,
        drop_last: bool = True,
        persistent_workers: bool | None = None,
        auto_distributed_partitioning: bool = True,
        mode: DataLoaderMode = DataLoaderMode.Sync,
        async_options: dict[str, Any] | None = None,
        rebatched_worker_size: int | None = None,
        batch_sampler: Iterable[list[int]] | None = None,
        *,
        order: str = ORDER_POPTORCH,
        **kwargs: Any,
    ) -> None:
        _check_batch_size(batch_size)
        shuffle = bool(shuffle)
        mode = DataLoaderMode(mode)
        if order not in ORDERS:
            raise ValueError(f"DataLoader order={order!r} is invalid: use one of {ORDERS}")
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        if hasattr(options, "_freeze"):
            options._freeze()
        self._options = options
        self._mode = mode
        self._order = order
        self._shuffle = shuffle
        self._auto = auto_distributed_partitioning
        self._drop_last = drop_last

        device_iterations = int(options.device_iterations)
        local_replicas = int(options.replication_factor) // int(
            getattr(options, "input_group_size", 1)
        )
        accumulation = int(options.Training.gradient_accumulation)
        self._process_id = int(options.Distributed.processId)
        self._num_processes = int(options.Distributed.numProcesses)
        self._micro_batches = device_iterations * local_replicas * accumulation
        self._topology = (device_iterations, local_replicas, accumulation)
        self._seed: int | None = options.random_seed
        self._batch_size = batch_size

        # Iteration state: the epoch and batch the next ``__iter__`` starts at.
        self._next_epoch = 0
        self._next_batch = 0
        self._epoch = -1
        self._consumed = 0
        self._epoch_done = True
        self._prefetcher: Prefetcher[Any] | None = None

        self._sampler: _EpochSampler | None = None
        self._combining: _CombiningBatchSampler | None = None
        self._num_samples: int | None = None
        self._combined: int | None = None
        self._group = 1  # worker batches per combined batch (AsyncRebatched)

        distributed = self._num_processes > 1 and self._auto
        torch_kwargs: dict[str, Any] = dict(kwargs)
        # Torch draws its workers' base seed from this generator at every ``__iter__``;
        # a private one, re-seeded per epoch, keeps the global generator untouched by
        # iteration (so a resumed run continues the same random stream) and gives each
        # instance's workers their own seeds.
        self._generator: torch.Generator | None = None
        self._worker_seed = self._seed
        if kwargs.get("generator") is None:
            self._generator = torch.Generator()
            torch_kwargs["generator"] = self._generator
            if self._worker_seed is None:
                self._worker_seed = int(torch.empty((), dtype=torch.int64).random_().item())
        is_iterable = isinstance(dataset, tud.IterableDataset)

        if batch_sampler is not None:
            self._setup_batch_sampler(batch_sampler, batch_size, shuffle, drop_last, kwargs)
            super().__init__(
                dataset,
                batch_sampler=self._combining,
                num_workers=num_workers,
                persistent_workers=persistent_workers,
                **torch_kwargs,
            )
            self._check_async(mode, async_options, rebatched_worker_size)
            return

        if batch_size is None:
            if self._auto:
                raise ValueError(
                    "DataLoader batch_size=None is only allowed with "
                    "auto_distributed_partitioning=False: the loader needs a micro-batch "
                    "size to build combined batches"
                )
            self._check_async(mode, async_options, rebatched_worker_size)
            super().__init__(
                dataset,
                batch_size=None,
                shuffle=shuffle,
                num_workers=num_workers,
                drop_last=False,  # no batches, nothing to drop
                persistent_workers=persistent_workers,
                **torch_kwargs,
            )
            return

        self._combined = sharding.combined_batch_size(
            batch_size, device_iterations, local_replicas, accumulation
        )
        worker_batch = self._check_async(mode, async_options, rebatched_worker_size)

        if is_iterable:
            if shuffle:
                raise ValueError(
                    "DataLoader shuffle=True cannot shuffle an IterableDataset: shuffle "
                    "inside the dataset's __iter__ instead"
                )
            dataset = _ShardedIterable(dataset, self._process_id, self._num_processes, self._auto)
        elif "sampler" in kwargs and kwargs["sampler"] is not None:
            if distributed:
                raise ValueError(
                    "DataLoader(sampler=...) cannot be combined with automatic partitioning "
                    f"over {self._num_processes} processes: pass a batch_sampler (sharded "
                    "here), or auto_distributed_partitioning=False and shard it yourself"
                )
        else:
            self._setup_map_style(dataset, shuffle, drop_last)
            torch_kwargs["sampler"] = self._sampler
            shuffle = False

        super().__init__(
            dataset,
            batch_size=worker_batch,
            shuffle=shuffle,
            num_workers=num_workers,
            drop_last=drop_last,
            persistent_workers=persistent_workers,
            **torch_kwargs,
        )

    # -- set-up -------------------------------------------------------------------------

    def _setup_batch_sampler(
        self,
        batch_sampler: Iterable[list[int]],
        batch_size: int | None,
        shuffle: bool,
        drop_last: bool,
        kwargs: dict[str, Any],
    ) -> None:
        if batch_size != 1 or shuffle or kwargs.get("sampler") is not None:
            raise ValueError(
                "DataLoader batch_sampler is mutually exclusive with batch_size, shuffle and "
                "sampler: each index list the batch_sampler yields is one micro-batch; "
                "leave batch_size=1 and shuffle=False"
            )
        processes = self._num_processes if self._auto else 1
        process_id = self._process_id if self._auto else 0
        self._combining = _CombiningBatchSampler(
            batch_sampler, self._micro_batches, processes, process_id, drop_last
        )

    def _check_async(
        self, mode: DataLoaderMode, async_options: dict[str, Any] | None, worker_size: int | None
    ) -> int | None:
        """Validate the asynchronous options; returns the batch size torch should use."""
        unknown = set(async_options or {}) - ASYNC_OPTION_KEYS
        if unknown:
            raise ValueError(
                f"DataLoader async_options has unknown keys {sorted(unknown)}: "
                f"known keys are {sorted(ASYNC_OPTION_KEYS)}"
            )
        depth = (async_options or {}).get("buffer_size", DEFAULT_BUFFER_SIZE)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(
                f"DataLoader async_options['buffer_size']={depth!r} is invalid: "
                "use a positive integer (combined batches loaded ahead)"
            )
        self._depth = depth
        if worker_size is None or self._combined is None:
            if worker_size is not None:
                raise ValueError(
                    "DataLoader rebatched_worker_size needs batch_size set and no batch_sampler"
                )
            return self._combined
        if mode != DataLoaderMode.AsyncRebatched:
            raise ValueError(
                f"DataLoader rebatched_worker_size={worker_size} only applies to "
                "mode=DataLoaderMode.AsyncRebatched"
            )
        if (
            isinstance(worker_size, bool)
            or not isinstance(worker_size, int)
            or worker_size < 1
            or self._combined % worker_size
        ):
            raise ValueError(
                f"DataLoader rebatched_worker_size={worker_size!r} is invalid: it must be a "
                f"positive divisor of the combined batch size {self._combined}"
            )
        self._group = self._combined // worker_size
        return worker_size

    def _setup_map_style(self, dataset: Any, shuffle: bool, drop_last: bool) -> None:
        if not isinstance(dataset, Sized):
            raise ValueError(
                f"DataLoader needs len(dataset): {type(dataset).__name__} has no __len__ "
                "(make it an IterableDataset to stream it)"
            )
        num_samples = len(dataset)
        combined = self._combined
        assert combined is not None
        processes = self._num_processes if self._auto else 1
        if shuffle and processes > 1 and self._seed is None:
            raise ValueError(
                f"DataLoader shuffle=True with {processes} processes needs "
                "Options.randomSeed(...) so that every process shuffles the same way: "
                "call options.randomSeed(<int>) before building the DataLoader"
            )
        if num_samples == 0:
            raise ValueError("DataLoader got an empty dataset (len(dataset) == 0)")
        b, (di, r, ga) = self._batch_size, self._topology
        needed = combined * processes
        if drop_last and num_samples < needed:
            raise ValueError(
                f"DataLoader: the dataset of {num_samples} samples is smaller than one "
                f"combined batch per process ({combined} = batch_size {b} × deviceIterations "
                f"{di} × local replicas {r} × gradientAccumulation {ga}, × {processes} "
                f"processes = {needed}), so every epoch would be empty: use a smaller "
                "batch_size or fewer device iterations/replicas/accumulation steps, or "
                "drop_last=False"
            )
        if not drop_last and processes > 1 and num_samples < processes:
            raise ValueError(
                f"DataLoader: the dataset of {num_samples} samples leaves some of the "
                f"{processes} processes without any sample: use a larger dataset or fewer "
                "instances"
            )
        if not drop_last and num_samples % needed:
            per_process = [
                num_samples // processes + (num_samples % processes > p) for p in range(processes)
            ]
            last = per_process[self._process_id if processes > 1 else 0] % combined
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
            warnings.warn(message, stacklevel=3)
        self._num_samples = num_samples
        if processes > 1 or self._order == ORDER_TOPOLOGY_INVARIANT:
            if shuffle:
                self._draw_seed()
            length = len(self._epoch_indices(0))
        else:
            length = num_samples
        self._sampler = _EpochSampler(length)

    def _draw_seed(self) -> None:
        """Without ``randomSeed``, shuffle from torch's global generator, as torch does."""
        if self._seed is None:
            self._seed = int(torch.empty((), dtype=torch.int64).random_().item())

    def _epoch_indices(self, epoch: int) -> list[int]:
        """This process's sample indices for ``epoch``, in the order they are loaded."""
        assert self._num_samples is not None and self._combined is not None
        n = self._num_samples
        processes = self._num_processes if self._auto else 1
        process_id = self._process_id if self._auto else 0
        seed = self._seed if self._shuffle else None
        if self._order == ORDER_TOPOLOGY_INVARIANT:
            di, r, ga = self._topology
            assert self._batch_size is not None
            return sharding.topology_invariant_indices(
                n,
                micro_batch_size=self._batch_size,
                device_iterations=di,
                gradient_accumulation=ga,
                local_replicas=r,
                num_processes=processes,
                process_id=process_id,
                shuffle=self._shuffle,
                seed=seed,
                epoch=epoch,
                drop_last=self._drop_last,
            )
        if processes > 1:
            return sharding.process_indices(
                n,
                self._combined,
                processes,
                process_id,
                drop_last=self._drop_last,
                shuffle=self._shuffle,
                seed=seed,
                epoch=epoch,
            )
        if self._shuffle:
            assert seed is not None
            return sharding.epoch_permutation(n, seed, epoch)
        return list(range(n))

    # -- PopTorch's surface -------------------------------------------------------------

    @property
    def combinedBatchSize(self) -> int | None:  # PopTorch's name
        """Samples per iteration on this instance (None with ``batch_sampler``/no batching)."""
        return self._combined

    @property
    def options(self) -> _Options:
        """The (frozen) Options this loader was built with."""
        return self._options

    @property
    def mode(self) -> DataLoaderMode:
        return self._mode

    def terminate(self) -> None:
        """Stop background prefetching and torch's worker processes of this loader."""
        prefetcher, self._prefetcher = self._prefetcher, None
        stopped = prefetcher.close() if prefetcher is not None else True
        iterator = getattr(self, "_iterator", None)
        if stopped and iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
            self._iterator = None

    def __del__(self) -> None:
        prefetcher = getattr(self, "_prefetcher", None)
        if prefetcher is not None:
            prefetcher.close()

    # -- iteration ----------------------------------------------------------------------

    def __len__(self) -> int:
        if self._combining is not None or self._sampler is None or self._combined is None:
            length = super().__len__()
            return (
                math.ceil(length / self._group)
                if self._group > 1 and not self.drop_last
                else length // self._group
            )
        samples = self._sampler.length
        return samples // self._combined if self.drop_last else math.ceil(samples / self._combined)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        epoch, skip = self._next_epoch, self._next_batch
        self._epoch, self._consumed, self._epoch_done = epoch, skip, False
        self._next_epoch, self._next_batch = epoch + 1, 0
        fast_skip = skip
        if self._sampler is not None:
            if self._shuffle:
                self._draw_seed()
            assert self._combined is not None
            self._sampler.indices = self._epoch_indices(epoch)[skip * self._combined :]
            fast_skip = 0
        elif self._combining is not None:
            self._combining.skip = skip
            fast_skip = 0
        if self._generator is not None:
            assert self._worker_seed is not None
            mixed = (self._worker_seed * 1_000_003 + epoch * 7_919 + self._process_id) % 2**63
            self._generator.manual_seed(mixed)
        source: Iterator[Any] = super().__iter__()
        if self._group > 1:
            source = rebatch(source, self._group, self.drop_last)
        for _ in range(fast_skip):  # no index-level skip here: load and drop
            if next(source, _END) is _END:
                break
        if self._mode != DataLoaderMode.Sync:
            self._prefetcher = Prefetcher(source, self._depth, name="popdist-dataloader")
            source = self._prefetcher
        return _LoaderIterator(self, source, epoch)

    def _count(self, epoch: int) -> None:
        if epoch == self._epoch:
            self._consumed += 1

    def _finish(self, epoch: int) -> None:
        if epoch == self._epoch:
            self._epoch_done = True

    # -- data-order state (checkpoints) -------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the data order stands: resume with :meth:`load_state_dict`."""
        in_progress = self._epoch >= 0 and not self._epoch_done
        if in_progress and self._combining is None and self._combined is not None:
            with contextlib.suppress(TypeError):  # no len(): trust the end-of-epoch signal
                in_progress = self._consumed < len(self)
        if in_progress:
            epoch, batch = self._epoch, self._consumed
        else:
            epoch, batch = self._next_epoch, self._next_batch
        return {
            "epoch": epoch,
            "batch": batch,
            "seed": self._seed,
            "worker_seed": self._worker_seed,
            "topology": self._topology_record(),
        }

    def _topology_record(self) -> dict[str, Any]:
        """What decides which samples a combined batch holds: resuming needs the same."""
        di, local, ga = self._topology
        return {
            "processes": self._num_processes if self._auto else 1,
            "local_replicas": local,
            "device_iterations": di,
            "gradient_accumulation": ga,
            "batch_size": self._batch_size,
            "combined": self._combined,
            "num_samples": self._num_samples,
            "order": self._order,
            "shuffle": self._shuffle,
            "drop_last": self._drop_last,
        }

    def _resume_batch(self, saved: Mapping[str, Any], batch: int) -> int:
        """``batch`` (saved on ``saved``'s topology) as a batch index of this topology.

        The same topology, or the start of an epoch: unchanged. The topology-invariant order
        with a step boundary in common: the batch that starts at the same sample. Otherwise
        resuming would skip or repeat samples: refused, with what to do.
        """
        current = self._topology_record()
        if batch == 0 or dict(saved) == current:
            return batch

        def describe(t: Mapping[str, Any]) -> str:
            return (
                f"{t['processes']} process(es) × {t['local_replicas']} local replica(s), "
                f"combined batch {t['combined']}, {t['order']} order"
            )

        same_data = all(
            saved.get(key) == current[key] for key in ("num_samples", "shuffle", "drop_last")
        )
        if same_data and saved.get("order") == current["order"] == ORDER_TOPOLOGY_INVARIANT:
            old_step = int(saved["combined"]) * int(saved["processes"])
            new_step = int(current["combined"]) * int(current["processes"])
            n = int(current["num_samples"])
            shift_same = not self._shuffle or n % old_step == n % new_step
            consumed = batch * old_step
            if shift_same and consumed % new_step == 0:
                return consumed // new_step
        raise ValueError(
            f"DataLoader state was saved mid-epoch (batch {batch}) with {describe(saved)}; "
            f"this DataLoader has {describe(current)}: resuming would skip or repeat samples. "
            "Resume with the same topology, save at the end of an epoch, or use "
            "order='topology_invariant' with global steps that divide each other"
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``__iter__`` start at the saved epoch and batch.

        A state saved with another topology (instances, replicas, batch sizes) resumes only
        where the same samples follow: see :meth:`_resume_batch`.
        """
        epoch, batch = int(state["epoch"]), int(state.get("batch", 0))
        if epoch < 0 or batch < 0:
            raise ValueError(f"DataLoader state epoch={epoch}, batch={batch} must be >= 0")
        saved = state.get("topology")
        if saved is not None:
            batch = self._resume_batch(saved, batch)
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        self._next_epoch, self._next_batch = epoch, batch
        self._epoch, self._consumed, self._epoch_done = -1, 0, True
        seed, worker_seed = state.get("seed"), state.get("worker_seed")
        if seed is not None:
            self._seed = int(seed)
        if worker_seed is not None:
            self._worker_seed = int(worker_seed)


_END = object()


class _LoaderIterator(Iterator[Any]):
    """Counts the batches handed out, for the loader's data-order state."""

    def __init__(self, loader: DataLoader, source: Iterator[Any], epoch: int) -> None:
        self._loader = loader
        self._source = source
        self._epoch = epoch

    def __iter__(self) -> _LoaderIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._source)
        except StopIteration:
            self._loader._finish(self._epoch)
            raise
        self._loader._count(self._epoch)
        return batch

    def __len__(self) -> int:
        return len(self._loader)
