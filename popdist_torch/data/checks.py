"""The DataLoader's argument checks: each error names the argument, its value and the fix."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sized
from typing import Any

from torch.utils.data import DistributedSampler

from popdist_torch.data.plan import DEFAULT_BUFFER_SIZE, ORDERS, LoaderPlan
from popdist_torch.enums import DataLoaderMode
from popdist_torch.errors import DataLoaderError

__all__ = [
    "ASYNC_OPTION_KEYS",
    "check_async",
    "check_batch_size",
    "check_map_style",
    "check_order",
    "check_sampler",
    "warn_uneven",
]

log = logging.getLogger("popdist_torch.data")

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


def check_batch_size(batch_size: object) -> None:
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DataLoaderError(
            f"DataLoader batch_size={batch_size!r} is invalid: it is the micro-batch size "
            "of one replica and must be a positive integer (e.g. batch_size=1)"
        )


def check_order(order: str) -> None:
    if order not in ORDERS:
        raise DataLoaderError(f"DataLoader order={order!r} is invalid: use one of {ORDERS}")


def check_async(
    mode: DataLoaderMode,
    async_options: dict[str, Any] | None,
    worker_size: int | None,
    combined: int | None,
) -> tuple[int, int | None]:
    """The prefetch depth and the batch size torch should use, from the async arguments.

    As PopTorch, what the mode does not use is ignored, with a note at INFO level
    (``poptorch.setLogLevel("INFO")``): ``async_options`` in ``Sync`` mode (nothing is
    read ahead), ``rebatched_worker_size`` outside ``AsyncRebatched`` (nothing is rebatched).
    """
    if mode == DataLoaderMode.Sync and async_options:
        log.info(
            "DataLoader async_options=%r ignored: mode=DataLoaderMode.Sync reads nothing ahead",
            async_options,
        )
        async_options = None
    if worker_size is not None and mode != DataLoaderMode.AsyncRebatched:
        log.info(
            "DataLoader rebatched_worker_size=%r ignored: only "
            "mode=DataLoaderMode.AsyncRebatched rebatches (mode is %s)",
            worker_size,
            DataLoaderMode(mode).name,
        )
        worker_size = None
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


def check_map_style(plan: LoaderPlan, dataset: Any, seed: int | None) -> int:
    """Check a map-style dataset against the plan's batches; returns its length."""
    if not isinstance(dataset, Sized):
        raise DataLoaderError(
            f"DataLoader needs len(dataset): {type(dataset).__name__} has no __len__ "
            "(make it an IterableDataset to stream it)"
        )
    num_samples, combined, processes = len(dataset), plan.combined, plan.processes
    assert combined is not None
    if plan.shuffle and processes > 1 and seed is None:
        raise DataLoaderError(
            f"DataLoader shuffle=True with {processes} processes needs "
            "Options.randomSeed(...) so that every process shuffles the same way: "
            "call options.randomSeed(<int>) before building the DataLoader"
        )
    if num_samples == 0:
        raise DataLoaderError("DataLoader got an empty dataset (len(dataset) == 0)")
    b, (di, r, ga) = plan.batch_size, plan.topology
    needed = combined * processes
    if plan.drop_last and num_samples < needed:
        raise DataLoaderError(
            f"DataLoader: the dataset of {num_samples} samples is smaller than one "
            f"combined batch per process ({combined} = batch_size {b} × deviceIterations "
            f"{di} × local replicas {r} × gradientAccumulation {ga}, × {processes} "
            f"processes = {needed}), so every epoch would be empty: use a smaller "
            "batch_size or fewer device iterations/replicas/accumulation steps, or "
            "drop_last=False"
        )
    if not plan.drop_last and processes > 1 and num_samples < processes:
        raise DataLoaderError(
            f"DataLoader: the dataset of {num_samples} samples leaves some of the "
            f"{processes} processes without any sample: use a larger dataset or fewer "
            "instances"
        )
    if not plan.drop_last and num_samples % needed:
        warn_uneven(num_samples, combined, processes, plan.process_id)
    return num_samples


def warn_uneven(num_samples: int, combined: int, processes: int, process_id: int) -> None:
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
    warnings.warn(message, stacklevel=7)  # the caller of DataLoader(...)


def check_sampler(plan: LoaderPlan, sampler: Any, seed: int | None) -> int:
    """Check a ``sampler`` the loader shards (source ``SAMPLED``); returns ``len(sampler)``."""
    name = type(sampler).__name__
    if isinstance(sampler, DistributedSampler) and plan.processes > 1:
        raise DataLoaderError(
            f"DataLoader(sampler={name}) is already split per process, and the loader shards "
            f"its sampler over the {plan.processes} processes again (each would load a part "
            "of its part): pass the sampler it splits (RandomSampler(dataset), or no sampler "
            "and shuffle=True), or auto_distributed_partitioning=False to keep its split"
        )
    if not isinstance(sampler, Sized):
        raise DataLoaderError(
            f"DataLoader(sampler={name}) is sharded over {plan.processes} process(es) one "
            "epoch at a time and needs len(sampler): give the sampler a __len__, or pass "
            "auto_distributed_partitioning=False and shard it yourself"
        )
    if plan.seeds_sampler and plan.processes > 1 and seed is None:
        raise DataLoaderError(
            f"DataLoader(sampler={name}) draws its order from no generator of its own "
            f"(generator=None, or no generator attribute): with {plan.processes} processes "
            "every process must draw the same one: call options.randomSeed(<int>) before "
            "building the DataLoader (the loader then seeds each epoch's draw: the sampler's "
            "generator, or torch's for a sampler without one), or give the sampler a "
            "generator seeded the same on every process"
        )
    num_samples, width = len(sampler), sum(plan.combined_sizes())
    if num_samples == 0:
        raise DataLoaderError(f"DataLoader(sampler={name}) yields no index (len(sampler) == 0)")
    if plan.drop_last and num_samples < width:
        raise DataLoaderError(
            f"DataLoader(sampler={name}): its epoch of {num_samples} indices is smaller than "
            f"one combined batch per process ({width} over {plan.processes} process(es)), so "
            "every epoch would be empty: use a smaller batch_size or fewer device "
            "iterations/replicas/accumulation steps, or drop_last=False"
        )
    if not plan.drop_last and plan.processes > 1 and num_samples % width:
        warnings.warn(
            f"DataLoader(sampler={name}): {num_samples} indices are not a whole number of "
            f"rounds of combined batches ({width} over {plan.processes} processes): the last "
            "round gives some processes a short batch or none (collectives across instances "
            "could hang): use drop_last=True",
            stacklevel=7,
        )
    return num_samples
