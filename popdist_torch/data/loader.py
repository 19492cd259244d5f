"""PopTorch's ``DataLoader`` on torch: combined batches, per-instance shards, prefetching.

One call of the loader yields one *combined batch*: ``batch_size × deviceIterations × local
replicas × gradientAccumulation`` samples, what one instance's model consumes per call.
With more than one process, each instance reads only its shard of a map-style dataset,
computed by :mod:`popdist.sharding` (PopTorch's order by default, a topology-invariant one
with ``order="topology_invariant"``).

What the arguments mean is worked out once into a frozen
:class:`~popdist_torch.data.plan.LoaderPlan`; each epoch's order is an immutable
:class:`~popdist_torch.data.epoch_order.EpochOrder` computed when the epoch starts, in the
main process, and fed to torch through a sampler, so worker processes always see the current
epoch's order and a checkpoint can resume mid-epoch without loading skipped samples. The
loader itself owns only the iteration: the epoch and batch it stands at, its seeds, and the
prefetch thread.

Beyond PopTorch: a ``batch_sampler`` yields micro-batches that are combined and sharded
here, and so is any ``sampler`` (``RandomSampler``, ``SequentialSampler``, a user's own)
with automatic partitioning over several processes, by the same rule; an ``IterableDataset``
is sharded by instance and worker; a dataset too small for one combined batch is an error
rather than an empty loader.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import torch
from torch.utils import data as tud
from torch.utils._pytree import tree_map

from popdist_torch.data.arguments import LoaderArguments, make_plan
from popdist_torch.data.epoch_order import EpochOrder, Seeds
from popdist_torch.data.plan import (
    BATCH_SAMPLER,
    BY_INDEX,
    ORDER_POPTORCH,
    SAMPLED,
    STREAM,
    UNBATCHED,
    LoaderOptions,
    LoaderPlan,
)
from popdist_torch.data.position import resume_batch, topology_record
from popdist_torch.data.prefetch import Prefetcher, rebatch
from popdist_torch.data.samplers import CombiningBatchSampler, EpochSampler, sampler_epoch
from popdist_torch.data.streams import ShardedIterable
from popdist_torch.enums import DataLoaderMode
from popdist_torch.errors import DataLoaderError
from popdist_torch.execution.synthetic import generated

__all__ = ["DataLoader"]


class _Feeds(NamedTuple):
    """What torch is given, and the objects of it the loader feeds each epoch."""

    dataset: Any
    kwargs: dict[str, Any]
    sampler: EpochSampler | None
    combining: CombiningBatchSampler | None
    generator: torch.Generator | None


class DataLoader(tud.DataLoader[Any]):
    """PopTorch-compatible DataLoader; a ``torch.utils.data.DataLoader`` underneath.

    ``batch_size`` is the micro-batch size; each iteration yields one combined batch of
    :attr:`combinedBatchSize` samples. See ``docs/dataloader.md``.
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
        args = LoaderArguments(
            batch_size=batch_size,
            shuffle=bool(shuffle),
            drop_last=drop_last,
            auto_distributed_partitioning=auto_distributed_partitioning,
            mode=mode,
            async_options=async_options,
            rebatched_worker_size=rebatched_worker_size,
            batch_sampler=batch_sampler,
            order=order,
            sampler=kwargs.get("sampler"),
            generator=kwargs.get("generator"),
        )
        self._options = options
        self._user_dataset = dataset
        self._user_sampler = kwargs.get("sampler")  # sharded per epoch where source is SAMPLED
        self._synthetic_batch: Any = None  # with enableSyntheticData: the batch yielded
        self._plan, self._seeds = make_plan(options, dataset, args)
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        kwargs.update(num_workers=num_workers, persistent_workers=persistent_workers)
        feeds = _feeds(self._plan, dataset, batch_sampler, kwargs)
        self._sampler, self._combining, self._generator = (
            feeds.sampler,
            feeds.combining,
            feeds.generator,
        )
        # Iteration state: the epoch and batch the next ``__iter__`` starts at, and the
        # epoch being read (its batches handed out, whether it ended).
        self._next_epoch = 0
        self._next_batch = 0
        self._epoch = -1
        self._consumed = 0
        self._epoch_done = True
        self._prefetcher: Prefetcher[Any] | None = None
        super().__init__(feeds.dataset, **feeds.kwargs)

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
        plan = self._plan
        if plan.epoch_length is None or plan.combined is None:
            length = super().__len__()
            if plan.group > 1 and not self.drop_last:
                return math.ceil(length / plan.group)
            return length // plan.group
        if self.drop_last:
            return plan.epoch_length // plan.combined
        return math.ceil(plan.epoch_length / plan.combined)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._stop_prefetching()
        epoch, skip = self._next_epoch, self._next_batch
        self._epoch, self._consumed, self._epoch_done = epoch, skip, False
        self._next_epoch, self._next_batch = epoch + 1, 0
        if getattr(self._options, "synthetic_data", False):
            return _LoaderIterator(self, self._synthetic_epoch(skip), epoch)
        order = self._start(epoch)
        fast_skip = self._feed(order, skip)
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

    def _synthetic_epoch(self, skip: int) -> Iterator[Any]:
        """An epoch of generated batches (``enableSyntheticData``): the dataset is read once,
        one sample, for the batch's structure, shapes and types; no worker starts."""
        if self._synthetic_batch is None:
            self._synthetic_batch = synthetic_batch(self._user_dataset, self._plan, self.collate_fn)
        try:
            batches = len(self)
        except TypeError:
            raise DataLoaderError(
                "enableSyntheticData(True) needs a dataset with a length (len(dataset)), to "
                "know how many batches an epoch has"
            ) from None
        return itertools.repeat(self._synthetic_batch, max(batches - skip, 0))

    def _start(self, epoch: int) -> EpochOrder:
        """The order of ``epoch`` (drawing the shuffle seed the first time one is needed)."""
        plan = self._plan
        if plan.by_index and (plan.shuffle or plan.seeds_sampler):
            self._seeds = self._seeds.with_shuffle_seed()
        sequence = None
        if plan.source == SAMPLED:
            seed = self._seeds.shuffle if plan.seeds_sampler else None
            assert self._user_sampler is not None
            sequence = sampler_epoch(self._user_sampler, seed, epoch)
        return EpochOrder.of(plan, epoch, self._seeds, sequence)

    def _feed(self, order: EpochOrder, skip: int) -> int:
        """Hand torch ``order`` from batch ``skip`` on; returns the batches left to drop."""
        if self._sampler is not None:
            assert self._plan.combined is not None
            self._sampler.indices = order.from_batch(skip, self._plan.combined)
            skip = 0
        elif self._combining is not None:
            self._combining.skip, skip = skip, 0
        if self._generator is not None:
            assert order.worker_seed is not None
            self._generator.manual_seed(order.worker_seed)
        return skip

    def _stop_prefetching(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

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
        if in_progress and self._combining is None and self._plan.combined is not None:
            with contextlib.suppress(TypeError):  # no len(): trust the end-of-epoch signal
                in_progress = self._consumed < len(self)
        if in_progress:
            epoch, batch = self._epoch, self._consumed
        else:
            epoch, batch = self._next_epoch, self._next_batch
        return {
            "epoch": epoch,
            "batch": batch,
            "seed": self._seeds.shuffle,
            "worker_seed": self._seeds.worker,
            "topology": topology_record(self._plan),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``__iter__`` start at the saved epoch and batch.

        A state saved with another topology (instances, replicas, batch sizes) resumes only
        where the same samples follow: see :func:`~popdist_torch.data.position.resume_batch`.
        """
        epoch, batch = int(state["epoch"]), int(state.get("batch", 0))
        if epoch < 0 or batch < 0:
            raise DataLoaderError(f"DataLoader state epoch={epoch}, batch={batch} must be >= 0")
        saved = state.get("topology")
        if saved is not None:
            batch = resume_batch(saved, topology_record(self._plan), batch)
        self._stop_prefetching()
        self._next_epoch, self._next_batch = epoch, batch
        self._epoch, self._consumed, self._epoch_done = -1, 0, True
        seed, worker_seed = state.get("seed"), state.get("worker_seed")
        self._seeds = Seeds(
            shuffle=self._seeds.shuffle if seed is None else int(seed),
            worker=self._seeds.worker if worker_seed is None else int(worker_seed),
        )


def _feeds(
    plan: LoaderPlan,
    dataset: Any,
    batch_sampler: Iterable[list[int]] | None,
    kwargs: dict[str, Any],
) -> _Feeds:
    """Torch's arguments for ``plan``: the dataset, the keywords and the objects fed per epoch."""
    torch_kwargs = dict(kwargs)
    generator = torch.Generator() if plan.private_generator else None
    if generator is not None:
        torch_kwargs["generator"] = generator
    sampler, combining = None, None
    if plan.source == BATCH_SAMPLER:
        assert batch_sampler is not None
        combining = CombiningBatchSampler(
            batch_sampler, plan.micro_batches, plan.processes, plan.shard_id, plan.drop_last
        )
        torch_kwargs["batch_sampler"] = combining
    elif plan.source == UNBATCHED:
        torch_kwargs.update(batch_size=None, shuffle=plan.shuffle, drop_last=False)
    else:
        shuffle = plan.shuffle
        if plan.source == STREAM:
            dataset = ShardedIterable(dataset, plan.process_id, plan.num_processes, plan.auto)
        elif plan.source in (BY_INDEX, SAMPLED):
            assert plan.epoch_length is not None
            sampler, shuffle = EpochSampler(plan.epoch_length), False
            torch_kwargs["sampler"] = sampler
        torch_kwargs.update(batch_size=plan.worker_batch, shuffle=shuffle, drop_last=plan.drop_last)
    return _Feeds(dataset, torch_kwargs, sampler, combining, generator)


_END = object()


def synthetic_batch(dataset: Any, plan: LoaderPlan, collate: Any) -> Any:
    """A generated combined batch shaped as ``plan`` makes them from ``dataset``'s samples.

    One sample is read (the first) and collated alone; each tensor of the result becomes a
    generated one (:func:`popdist_torch.execution.synthetic.generated`) with the combined
    batch size as its leading dimension. An unbatched loader's sample is its batch.
    """
    if plan.source == BATCH_SAMPLER:
        raise DataLoaderError(
            "enableSyntheticData(True) needs a batch_size (a batch_sampler's batches may "
            "differ in size): pass batch_size instead of batch_sampler"
        )
    sample = next(iter(dataset)) if isinstance(dataset, tud.IterableDataset) else dataset[0]
    if plan.source == UNBATCHED or plan.combined is None:
        template = tud.default_convert(sample)  # type: ignore[no-untyped-call]
        return tree_map(lambda t: generated(t) if isinstance(t, torch.Tensor) else t, template)
    combined = plan.combined
    template = collate([sample])

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        return generated(t, (combined, *t.shape[1:]) if t.dim() else (combined,))

    return tree_map(one, template)


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
