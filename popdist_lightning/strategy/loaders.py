"""A user's ``torch.utils.data.DataLoader`` rebuilt as a popdist_torch ``DataLoader``.

The user's ``batch_size`` is the micro-batch (one replica's batch); the rebuilt loader
yields combined batches of ``batch_size × deviceIterations × local replicas ×
gradientAccumulation`` samples, this instance's shard, in the topology-invariant order
(the global batch at step ``k`` holds the same samples whatever the number of instances
and replicas, so a run can be compared with ``accelerator="cpu"``).
"""

from __future__ import annotations

from typing import Any

from torch.utils import data as tud

import popdist_torch as poptorch
from popdist_lightning.errors import IPUStrategyError

__all__ = ["to_poptorch_loader"]

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
