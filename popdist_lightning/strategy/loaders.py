"""A user's ``torch.utils.data.DataLoader`` rebuilt as a popdist_torch ``DataLoader``.

The user's ``batch_size`` is the micro-batch (one replica's batch); the rebuilt loader
yields combined batches of ``batch_size × deviceIterations × local replicas ×
gradientAccumulation`` samples, this instance's shard, in the topology-invariant order
(the global batch at step ``k`` holds the same samples whatever the number of instances
and replicas, so a run can be compared with ``accelerator="cpu"``).

A user's own popdist_torch ``DataLoader`` built from the options they gave the strategy
(as Lightning 1.9 IPU programs do: ``poptorch.DataLoader(opts, ...)`` and
``IPUStrategy(training_opts=opts)``) combines batches for those options; the strategy
completes them (``accumulate_grad_batches`` into ``gradientAccumulation``, the replicas,
the process place), so such a loader is rebuilt with the completed options and its own
other arguments, as Lightning 1.9 set the accumulation on the options the loader read.
"""

from __future__ import annotations

from typing import Any

from torch.utils import data as tud

import popdist_torch as poptorch
from popdist_lightning.errors import IPUStrategyError
from popdist_torch.data.plan import USER_SAMPLER
from popdist_torch.data.samplers import CombiningBatchSampler
from popdist_torch.data.streams import ShardedIterable

__all__ = ["adopt_poptorch_loader", "to_poptorch_loader"]

#: torch DataLoader arguments passed on unchanged.
_PASSED = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn")


def _unwrap(batch_sampler: Any) -> Any:
    """Lightning wraps a predict loader's batch sampler to record indices: take the inner one."""
    inner = getattr(batch_sampler, "_batch_sampler", None)
    return inner if inner is not None else batch_sampler


def to_poptorch_loader(
    loader: tud.DataLoader[Any], options: poptorch.Options
) -> poptorch.DataLoader:
    """Rebuild ``loader`` for the executor run with ``options`` (frozen by the loader)."""
    kwargs: dict[str, Any] = {name: getattr(loader, name) for name in _PASSED}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["persistent_workers"] = loader.persistent_workers
    dataset = loader.dataset
    if isinstance(dataset, tud.IterableDataset):
        if loader.batch_size is None:
            raise IPUStrategyError(
                "an IterableDataset loader with batch_size=None cannot be rebuilt by "
                "IPUStrategy: give the DataLoader a batch_size (the micro-batch)"
            )
        return poptorch.DataLoader(options, dataset, batch_size=loader.batch_size, **kwargs)
    batch_sampler = _unwrap(loader.batch_sampler)
    if isinstance(batch_sampler, tud.BatchSampler):
        sampler = batch_sampler.sampler
        if isinstance(sampler, tud.RandomSampler):
            if sampler.replacement or sampler._num_samples is not None:
                raise IPUStrategyError(
                    "RandomSampler(replacement=True or num_samples=...) is not supported by "
                    "IPUStrategy: use DataLoader(shuffle=True) or a batch_sampler"
                )
            shuffle = True
        elif isinstance(sampler, tud.SequentialSampler):
            shuffle = False
        else:
            raise IPUStrategyError(
                f"DataLoader(sampler={type(sampler).__name__}) is not supported by IPUStrategy: "
                f"use shuffle=True/False, or pass a batch_sampler that yields micro-batches"
            )
        return poptorch.DataLoader(
            options,
            dataset,
            batch_size=batch_sampler.batch_size,
            shuffle=shuffle,
            drop_last=True,
            order="topology_invariant",
            **kwargs,
        )
    return poptorch.DataLoader(options, dataset, batch_sampler=batch_sampler, **kwargs)


def _topology(opts: Any) -> tuple[int, int, int]:
    return (
        int(opts.device_iterations),
        int(opts.replication_factor),
        int(opts.Training.gradient_accumulation),
    )


def adopt_poptorch_loader(
    loader: poptorch.DataLoader, options: poptorch.Options, stated: poptorch.Options | None
) -> poptorch.DataLoader:
    """The user's popdist_torch ``loader`` for a model run with ``options``.

    ``stated``: the options the user gave the strategy (``None``: PopTorch's defaults).
    A loader built with ``options``' topology is kept; one built with ``stated``'s is
    rebuilt with ``options``; any other is an error naming both.
    """
    theirs, mine = loader.options, options
    place = (mine.Distributed.processId, mine.Distributed.numProcesses)
    got = _topology(theirs)
    if (
        got == _topology(mine)
        and (
            theirs.Distributed.processId,
            theirs.Distributed.numProcesses,
        )
        == place
    ):
        return loader
    if got == _topology(stated if stated is not None else poptorch.Options()):
        return _rebuild(loader, options.clone())
    raise IPUStrategyError(
        f"a poptorch.DataLoader built with (deviceIterations, replicationFactor, "
        f"gradientAccumulation) = {got} feeds a model run with {_topology(mine)}: build it "
        f"with the options given to IPUStrategy, or return a torch DataLoader and let "
        f"IPUStrategy rebuild it"
    )


def _rebuild(loader: poptorch.DataLoader, options: poptorch.Options) -> poptorch.DataLoader:
    """``loader``'s arguments (what its plan kept of them) with other ``options``."""
    plan = loader._plan  # the loader's arguments, worked out (popdist_torch keeps no copy)
    kwargs: dict[str, Any] = {name: getattr(loader, name) for name in _PASSED}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["persistent_workers"] = loader.persistent_workers
    kwargs.update(
        drop_last=plan.drop_last,
        auto_distributed_partitioning=plan.auto,
        mode=plan.mode,
        async_options={"buffer_size": plan.depth},
        order=plan.order,
    )
    if plan.group > 1:
        kwargs["rebatched_worker_size"] = plan.worker_batch
    if not plan.private_generator:
        kwargs["generator"] = loader.generator
    dataset = loader.dataset
    if isinstance(dataset, ShardedIterable):  # an IterableDataset, sharded by the loader
        dataset = dataset.dataset
    if isinstance(loader.batch_sampler, CombiningBatchSampler):
        batch_sampler = loader.batch_sampler.batch_sampler
        return poptorch.DataLoader(options, dataset, batch_sampler=batch_sampler, **kwargs)
    if plan.source == USER_SAMPLER:
        kwargs["sampler"] = loader.sampler
    return poptorch.DataLoader(
        options, dataset, batch_size=plan.batch_size, shuffle=plan.shuffle, **kwargs
    )
