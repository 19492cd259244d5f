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
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from torch.utils import data as tud

from popdist_torch._async import Prefetcher, rebatch
from popdist_torch.enums import DataLoaderMode
from popdist_torch.errors import DataLoaderError
from popdist_torch.loader_plan import (
    ORDER_POPTORCH,
    ORDER_TOPOLOGY_INVARIANT,
    ORDERS,
    LoaderOptions,
    LoaderPlan,
    current_shard,
)

__all__ = [
    "ORDERS",
    "ORDER_POPTORCH",
    "ORDER_TOPOLOGY_INVARIANT",
    "DataLoader",
    "DataLoaderError",
    "current_shard",
]


class DataLoader(tud.DataLoader[Any]):
    """PopTorch-compatible DataLoader; a ``torch.utils.data.DataLoader`` underneath.

    ``batch_size`` is the micro-batch size; each iteration yields one combined batch of
    :attr:`combinedBatchSize` samples. See ``docs/dataloader.md``. What the arguments mean
    is worked out by :class:`~popdist_torch.loader_plan.LoaderPlan`.
    """

    def __init__(
        self,
        options: LoaderOptions,
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
        if hasattr(options, "_freeze"):
            options._freeze()
        plan = LoaderPlan(
            options,
            dataset,
            batch_size=batch_size,
            shuffle=bool(shuffle),
            num_workers=num_workers,
            drop_last=drop_last,
            persistent_workers=persistent_workers,
            auto_distributed_partitioning=auto_distributed_partitioning,
            mode=mode,
            async_options=async_options,
            rebatched_worker_size=rebatched_worker_size,
            batch_sampler=batch_sampler,
            order=order,
            kwargs=kwargs,
        )
        self._options = options
        self._plan = plan
        # Iteration state: the epoch and batch the next ``__iter__`` starts at.
        self._next_epoch = 0
        self._next_batch = 0
        self._epoch = -1
        self._consumed = 0
        self._epoch_done = True
        self._prefetcher: Prefetcher[Any] | None = None
        super().__init__(plan.dataset, **plan.torch_kwargs)

    # -- PopTorch's surface -------------------------------------------------------------

    @property
    def combinedBatchSize(self) -> int | None:  # PopTorch's name
        """Samples per iteration on this instance (None with ``batch_sampler``/no batching)."""
        return self._plan.combined

    @property
    def options(self) -> LoaderOptions:
        """The (frozen) Options this loader was built with."""
        return self._options

    @property
    def mode(self) -> DataLoaderMode:
        return self._plan.mode

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
        if (
            self._plan.combining is not None
            or self._plan.sampler is None
            or self._plan.combined is None
        ):
            length = super().__len__()
            return (
                math.ceil(length / self._plan.group)
                if self._plan.group > 1 and not self.drop_last
                else length // self._plan.group
            )
        samples = self._plan.sampler.length
        return (
            samples // self._plan.combined
            if self.drop_last
            else math.ceil(samples / self._plan.combined)
        )

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        epoch, skip = self._next_epoch, self._next_batch
        self._epoch, self._consumed, self._epoch_done = epoch, skip, False
        self._next_epoch, self._next_batch = epoch + 1, 0
        fast_skip = skip
        if self._plan.sampler is not None:
            if self._plan.shuffle:
                self._plan.draw_seed()
            assert self._plan.combined is not None
            self._plan.sampler.indices = self._plan.epoch_indices(epoch)[
                skip * self._plan.combined :
            ]
            fast_skip = 0
        elif self._plan.combining is not None:
            self._plan.combining.skip = skip
            fast_skip = 0
        if self._plan.generator is not None:
            assert self._plan.worker_seed is not None
            mixed = (
                self._plan.worker_seed * 1_000_003 + epoch * 7_919 + self._plan.process_id
            ) % 2**63
            self._plan.generator.manual_seed(mixed)
        source: Iterator[Any] = super().__iter__()
        if self._plan.group > 1:
            source = rebatch(source, self._plan.group, self.drop_last)
        for _ in range(fast_skip):  # no index-level skip here: load and drop
            if next(source, _END) is _END:
                break
        if self._plan.mode != DataLoaderMode.Sync:
            self._prefetcher = Prefetcher(source, self._plan.depth, name="popdist-dataloader")
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
        if in_progress and self._plan.combining is None and self._plan.combined is not None:
            with contextlib.suppress(TypeError):  # no len(): trust the end-of-epoch signal
                in_progress = self._consumed < len(self)
        if in_progress:
            epoch, batch = self._epoch, self._consumed
        else:
            epoch, batch = self._next_epoch, self._next_batch
        return {
            "epoch": epoch,
            "batch": batch,
            "seed": self._plan.seed,
            "worker_seed": self._plan.worker_seed,
            "topology": self._topology_record(),
        }

    def _topology_record(self) -> dict[str, Any]:
        """What decides which samples a combined batch holds: resuming needs the same."""
        plan = self._plan
        di, local, ga = plan.topology
        return {
            "processes": plan.num_processes if plan.auto else 1,
            "local_replicas": local,
            "device_iterations": di,
            "gradient_accumulation": ga,
            "batch_size": plan.batch_size,
            "combined": plan.combined,
            "num_samples": plan.num_samples,
            "order": plan.order,
            "shuffle": plan.shuffle,
            "drop_last": plan.drop_last,
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
            shift_same = not current["shuffle"] or n % old_step == n % new_step
            consumed = batch * old_step
            if shift_same and consumed % new_step == 0:
                return consumed // new_step
        raise DataLoaderError(
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
            raise DataLoaderError(f"DataLoader state epoch={epoch}, batch={batch} must be >= 0")
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
            self._plan.seed = int(seed)
        if worker_seed is not None:
            self._plan.worker_seed = int(worker_seed)


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
