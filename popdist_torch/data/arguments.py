"""A ``DataLoader``'s arguments, checked and worked out into a :class:`LoaderPlan`.

Every argument is validated here, with a message naming it, before torch sees any of them;
the result is the frozen plan and the loader's first :class:`Seeds`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch.utils import data as tud

from popdist import sharding
from popdist_torch.data.checks import (
    check_async,
    check_batch_size,
    check_map_style,
    check_order,
    check_sampler,
)
from popdist_torch.data.epoch_order import Seeds, draw_seed, sampled_indices, shard_indices
from popdist_torch.data.plan import (
    BATCH_SAMPLER,
    BY_INDEX,
    ORDER_TOPOLOGY_INVARIANT,
    SAMPLED,
    STREAM,
    UNBATCHED,
    USER_SAMPLER,
    LoaderOptions,
    LoaderPlan,
)
from popdist_torch.enums import DataLoaderMode
from popdist_torch.errors import DataLoaderError
from popdist_torch.options.distributed import replica_counts

__all__ = ["LoaderArguments", "make_plan"]


@dataclass(frozen=True)
class LoaderArguments:
    """The DataLoader arguments that decide the plan (torch's own are passed through)."""

    batch_size: int | None
    shuffle: bool
    drop_last: bool
    auto_distributed_partitioning: bool
    mode: DataLoaderMode
    async_options: dict[str, Any] | None
    rebatched_worker_size: int | None
    batch_sampler: Iterable[list[int]] | None
    order: str
    sampler: Any = None
    generator: Any = None


def make_plan(
    options: LoaderOptions, dataset: Any, args: LoaderArguments
) -> tuple[LoaderPlan, Seeds]:
    """The plan of a loader of ``dataset`` with ``options``, and its first seeds."""
    check_batch_size(args.batch_size)
    check_order(args.order)
    plan = _base_plan(options, args)
    seeds = Seeds(shuffle=options.random_seed, worker=options.random_seed)
    if plan.private_generator and seeds.worker is None:
        seeds = dataclasses.replace(seeds, worker=draw_seed())
    if args.batch_sampler is not None:
        return _with_batch_sampler(plan, args), seeds
    if args.batch_size is None:
        return _unbatched(plan, args), seeds
    return _batched(plan, args, dataset, seeds)


def _base_plan(options: LoaderOptions, args: LoaderArguments) -> LoaderPlan:
    """What the options and the plain arguments say, before the source is known."""
    device_iterations = int(options.device_iterations)
    local_replicas = int(options.replication_factor) // int(getattr(options, "input_group_size", 1))
    accumulation = int(options.Training.gradient_accumulation)
    process_id = int(options.Distributed.processId)
    num_processes = int(options.Distributed.numProcesses)
    counts = replica_counts(num_processes, process_id, local_replicas)
    return LoaderPlan(
        mode=DataLoaderMode(args.mode),
        order=args.order,
        shuffle=bool(args.shuffle),
        auto=args.auto_distributed_partitioning,
        drop_last=args.drop_last,
        process_id=process_id,
        num_processes=num_processes,
        topology=(device_iterations, local_replicas, accumulation),
        batch_size=args.batch_size,
        source=UNBATCHED,
        private_generator=args.generator is None,
        replica_counts=counts if len(set(counts)) > 1 else None,
    )


def _with_async(plan: LoaderPlan, args: LoaderArguments, **changes: Any) -> LoaderPlan:
    """``plan`` with ``changes``, its prefetch depth and torch's batch size (async arguments)."""
    plan = dataclasses.replace(plan, **changes)
    depth, worker_batch = check_async(
        plan.mode, args.async_options, args.rebatched_worker_size, plan.combined
    )
    group = 1
    if worker_batch is not None and plan.combined is not None:
        group = plan.combined // worker_batch
    return dataclasses.replace(plan, depth=depth, worker_batch=worker_batch, group=group)


def _with_batch_sampler(plan: LoaderPlan, args: LoaderArguments) -> LoaderPlan:
    """The user's micro-batches, combined and dealt to the processes by the loader."""
    if plan.batch_size != 1 or plan.shuffle or args.sampler is not None:
        raise DataLoaderError(
            "DataLoader batch_sampler is mutually exclusive with batch_size, shuffle and "
            "sampler: each index list the batch_sampler yields is one micro-batch; "
            "leave batch_size=1 and shuffle=False"
        )
    return _with_async(plan, args, source=BATCH_SAMPLER)


def _unbatched(plan: LoaderPlan, args: LoaderArguments) -> LoaderPlan:
    """``batch_size=None``: the dataset's items as they are (no automatic partitioning)."""
    if plan.auto:
        raise DataLoaderError(
            "DataLoader batch_size=None is only allowed with "
            "auto_distributed_partitioning=False: the loader needs a micro-batch "
            "size to build combined batches"
        )
    return _with_async(plan, args, source=UNBATCHED)


def _batched(
    plan: LoaderPlan, args: LoaderArguments, dataset: Any, seeds: Seeds
) -> tuple[LoaderPlan, Seeds]:
    """Combined batches of micro-batches from this process's shard."""
    assert plan.batch_size is not None
    combined = sharding.combined_batch_size(plan.batch_size, *plan.topology)
    plan = _with_async(plan, args, combined=combined)
    if isinstance(dataset, tud.IterableDataset):
        if plan.shuffle:
            raise DataLoaderError(
                "DataLoader shuffle=True cannot shuffle an IterableDataset: shuffle "
                "inside the dataset's __iter__ instead"
            )
        return dataclasses.replace(plan, source=STREAM), seeds
    if args.sampler is not None:
        if plan.shuffle:
            raise DataLoaderError(
                "DataLoader sampler is mutually exclusive with shuffle=True: the sampler "
                "decides the order (torch.utils.data.RandomSampler shuffles)"
            )
        if plan.processes > 1 or plan.order == ORDER_TOPOLOGY_INVARIANT:
            return _sampled(plan, args.sampler, seeds)
        return dataclasses.replace(plan, source=USER_SAMPLER), seeds
    return _by_index(plan, dataset, seeds)


def _sampled(plan: LoaderPlan, sampler: Any, seeds: Seeds) -> tuple[LoaderPlan, Seeds]:
    """The user's sampler, sharded: each epoch, this instance's part of its sequence
    (:func:`~popdist_torch.data.epoch_order.sampled_indices`)."""
    seeded = _seeds_sampler(sampler)
    plan = dataclasses.replace(plan, source=SAMPLED, seeds_sampler=seeded)
    num_samples = check_sampler(plan, sampler, seeds.shuffle)
    if seeded:
        seeds = seeds.with_shuffle_seed()
    plan = dataclasses.replace(plan, num_samples=num_samples)
    length = len(sampled_indices(plan, range(num_samples)))
    return dataclasses.replace(plan, epoch_length=length), seeds


def _seeds_sampler(sampler: Any) -> bool:
    """Whether the loader seeds ``sampler``'s draw each epoch: it has no generator of its own
    (``RandomSampler(ds)``'s ``generator=None``, or none at all, a user's own sampler: torch
    would draw from each process's global generator), unless its order is fixed
    (``SequentialSampler``, a sequence of indices)."""
    if isinstance(sampler, (tud.SequentialSampler, Sequence)):
        return False
    return getattr(sampler, "generator", None) is None


def _by_index(plan: LoaderPlan, dataset: Any, seeds: Seeds) -> tuple[LoaderPlan, Seeds]:
    """A map-style dataset: each epoch, this instance's indices; the epoch's length."""
    num_samples = check_map_style(plan, dataset, seeds.shuffle)
    plan = dataclasses.replace(plan, source=BY_INDEX, num_samples=num_samples)
    length = num_samples
    if plan.processes > 1 or plan.order == ORDER_TOPOLOGY_INVARIANT:
        if plan.shuffle:
            seeds = seeds.with_shuffle_seed()
        length = len(shard_indices(plan, 0, seeds.shuffle))
    return dataclasses.replace(plan, epoch_length=length), seeds
