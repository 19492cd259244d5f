"""Which samples each process reads: the pure arithmetic of distributed data loading.

Two orders are offered:

* **PopTorch's** (:func:`poptorch_shard`, :func:`process_indices`): the dataset is cut into
  one contiguous block per process, ``[p0 p0 … p1 p1 … p2 …]``, exactly as PopTorch's
  distributed ``DataLoader`` does. With ``drop_last`` every block holds the same whole
  number of combined batches (an unequal count would hang the collectives); the samples
  that do not fit (the *leftovers*) are used on alternate epochs by shifting every block
  by their count. Shuffling draws one seeded permutation of the *whole* dataset per epoch,
  identical on every process, and the blocks are cut from it.
* **Topology-invariant** (:func:`topology_invariant_indices`): global step ``s`` uses the
  samples ``[s*G, (s+1)*G)`` of the (permuted) order, laid out as
  ``[device_iteration, accumulation, global_replica, micro_batch]``; each process takes its
  global replicas. Global replica ``r`` then sees the same samples at the same step whatever
  the split of the replicas into processes × local replicas, so a run can be re-shaped
  without changing its numerics.

Everything here is stdlib-only and side-effect free; the permutation is derived from
``(seed, epoch)`` with :class:`random.Random`, so it is the same on every process and every
platform. Bad arguments raise :class:`ShardingError` (both a :class:`PopdistError` and a
:class:`ValueError`) naming the argument and its value.
"""

from __future__ import annotations

import functools

from popdist.env import PopdistError, Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "Shard",
    "ShardingError",
    "combined_batch_size",
    "epoch_permutation",
    "global_batch_size",
    "poptorch_shard",
    "process_indices",
    "split_shard",
    "topology_invariant_indices",
    "worker_shard",
]


class ShardingError(PopdistError, ValueError):
    """A sharding argument out of range; the message names it, its value and the fix."""


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShardingError(f"{name}={value!r}: expected an integer >= 1")
    return value


def _non_negative(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ShardingError(f"{name}={value!r}: expected an integer >= 0")
    return value


def _index(name: str, value: int, count_name: str, count: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise ShardingError(
            f"{name}={value!r}: expected an integer in [0, {count}) ({count_name}={count})"
        )
    return value


def combined_batch_size(
    batch_size: int,
    device_iterations: int = 1,
    local_replicas: int = 1,
    gradient_accumulation: int = 1,
) -> int:
    """Samples one instance's DataLoader yields per call (PopTorch's ``combinedBatchSize``).

    ``batch_size`` is the micro-batch (one replica's batch); ``local_replicas`` is the
    replicas of this instance (PopTorch's ``replicationFactor``), not the total.
    """
    return (
        _positive("batch_size", batch_size)
        * _positive("device_iterations", device_iterations)
        * _positive("local_replicas", local_replicas)
        * _positive("gradient_accumulation", gradient_accumulation)
    )


def global_batch_size(
    micro_batch_size: int,
    local_replicas: int = 1,
    gradient_accumulation: int = 1,
    num_instances: int = 1,
) -> int:
    """Samples per weight update over all instances: micro × local replicas × GA × instances."""
    return (
        _positive("micro_batch_size", micro_batch_size)
        * _positive("local_replicas", local_replicas)
        * _positive("gradient_accumulation", gradient_accumulation)
        * _positive("num_instances", num_instances)
    )


class Shard(Record):
    """One process's contiguous block of the dataset (PopTorch's ``_SubDataset``).

    ``offset``: first index of the block before any shift (the base offset); ``length``:
    samples in the block; ``leftovers``: with ``drop_last``, ``num_samples % length``, the
    shift of even epochs (0, 2, ...) when leftovers rotate, else 0.
    """

    __slots__ = ("offset", "length", "leftovers")  # noqa: RUF023 - field order
    offset: int
    length: int
    leftovers: int

    def __init__(self, offset: int, length: int, leftovers: int) -> None:
        self._init(offset=offset, length=length, leftovers=leftovers)


def poptorch_shard(
    num_samples: int,
    combined_batch_size: int,
    num_processes: int,
    process_id: int,
    drop_last: bool = True,
) -> Shard:
    """This process's block, with PopTorch's arithmetic.

    With ``drop_last`` every process gets ``combined * (N // (combined * P))`` samples, so
    all read the same number of whole combined batches. Without it the N samples are split
    as evenly as possible (the first ``N % P`` processes get one more) and the last batch
    of a process may be partial.
    """
    n = _non_negative("num_samples", num_samples)
    step = _positive("combined_batch_size", combined_batch_size)
    procs = _positive("num_processes", num_processes)
    pid = _index("process_id", process_id, "num_processes", procs)
    if drop_last:
        per_proc = step * (n // (step * procs))
        if per_proc == 0:
            raise ShardingError(
                f"num_samples={n} is fewer than one combined batch per process "
                f"(combined_batch_size={step} × num_processes={procs} = {step * procs}); "
                f"with drop_last=True every process would read nothing: use a smaller batch, "
                f"fewer replicas or instances, or drop_last=False"
            )
        return Shard(offset=pid * per_proc, length=per_proc, leftovers=n % per_proc)
    base, extra = divmod(n, procs)
    return Shard(offset=pid * base + min(pid, extra), length=base + (pid < extra), leftovers=0)


def _counts(replica_counts: Sequence[int], process_id: int) -> tuple[list[int], int]:
    counts = [_positive("replica_counts[]", c) for c in replica_counts]
    if not counts:
        raise ShardingError("replica_counts=[]: expected one count per process")
    return counts, _index("process_id", process_id, "len(replica_counts)", len(counts))


def split_shard(
    num_samples: int,
    combined_batch_size: int,
    replica_counts: Sequence[int],
    process_id: int,
    drop_last: bool = True,
) -> Shard:
    """This process's block when processes hold different numbers of replicas.

    PopTorch's arithmetic per global replica: each replica gets the block
    :func:`poptorch_shard` would give a process of one replica, and a process's block is its
    replicas' blocks, which are contiguous. ``combined_batch_size`` is this process's;
    with ``drop_last`` every process reads the same number of combined batches, and
    ``leftovers`` is every sample no replica reads.
    """
    counts, pid = _counts(replica_counts, process_id)
    step = _positive("combined_batch_size", combined_batch_size)
    if step % counts[pid]:
        raise ShardingError(
            f"combined_batch_size={step} is not a multiple of this process's "
            f"{counts[pid]} replicas (replica_counts={list(counts)})"
        )
    per_replica = step // counts[pid]
    first, total = sum(counts[:pid]), sum(counts)
    replica = poptorch_shard(num_samples, per_replica, total, 0, drop_last)
    if drop_last:
        length = replica.length
        return Shard(first * length, counts[pid] * length, num_samples - total * length)
    base, extra = divmod(num_samples, total)
    offset = first * base + min(first, extra)
    stop = (first + counts[pid]) * base + min(first + counts[pid], extra)
    return Shard(offset=offset, length=stop - offset, leftovers=0)


@functools.lru_cache(maxsize=4)
def _permutation(num_samples: int, seed: int, epoch: int) -> tuple[int, ...]:
    import random  # lazy: keeps ``import popdist`` cheap

    order = list(range(num_samples))
    # A str seed is hashed with SHA-512 by Random (version 2 seeding): deterministic across
    # processes, interpreters and PYTHONHASHSEED, and distinct for every (seed, epoch).
    random.Random(f"popdist:{seed}:{epoch}").shuffle(order)
    return tuple(order)


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> list[int]:
    """The seeded permutation of ``range(num_samples)`` for ``epoch``, the same on every process.

    A pure function of ``(num_samples, seed, epoch)``: a new order every epoch, and a restarted
    run (or a late-joining process) can recompute any epoch's order without replaying the
    previous ones.
    """
    n = _non_negative("num_samples", num_samples)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ShardingError(f"seed={seed!r}: expected an integer")
    e = _non_negative("epoch", epoch)
    return list(_permutation(n, seed, e))


def _order(num_samples: int, seed: int | None, epoch: int) -> Sequence[int]:
    if seed is None:
        # One process, no seed: a fresh shuffle, as torch's RandomSampler would draw.
        import random

        order = list(range(num_samples))
        random.shuffle(order)
        return order
    return _permutation(num_samples, seed, epoch)


def _check_shuffle_seed(shuffle: bool, seed: int | None, num_processes: int) -> None:
    if shuffle and seed is None and num_processes > 1:
        raise ShardingError(
            f"shuffle=True with num_processes={num_processes} needs a seed (seed=None): set "
            f"poptorch.Options.randomSeed() so that every process draws the same permutation"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ShardingError(f"seed={seed!r}: expected an integer or None")


def _rotates(shuffle: bool, num_processes: int, rotate_leftovers: bool | None) -> bool:
    # PopTorch shifts the blocks by the leftovers only in its distributed shuffling path
    # (``_SubDataset.swap_range`` next to ``shuffle_global_indices``); ``rotate_leftovers``
    # asks for the shift explicitly, e.g. to use every sample without shuffling.
    return shuffle and num_processes > 1 if rotate_leftovers is None else rotate_leftovers


def process_indices(
    num_samples: int,
    combined_batch_size: int,
    num_processes: int,
    process_id: int,
    *,
    drop_last: bool = True,
    shuffle: bool = False,
    seed: int | None = None,
    epoch: int = 0,
    rotate_leftovers: bool | None = None,
    replica_counts: Sequence[int] | None = None,
) -> list[int]:
    """The dataset indices this process reads in ``epoch``, in order (PopTorch's order).

    The block of :func:`poptorch_shard`, shifted by its leftovers on even epochs (0, 2, ...)
    when the leftovers rotate (by default: when shuffling over more than one process, as
    PopTorch does: its ``swap_range`` runs before every epoch, the first included), and read through :func:`epoch_permutation` when ``shuffle``. With
    ``drop_last`` the length is a whole number of combined batches.

    ``replica_counts`` (every process's local replicas, in process order) describes a
    non-uniform split: the blocks are then cut per replica (:func:`split_shard`), so each
    process's block is its replicas' share and every process reads as many combined batches.
    """
    if replica_counts is not None and len(set(replica_counts)) > 1:
        shard = split_shard(num_samples, combined_batch_size, replica_counts, process_id, drop_last)
    else:
        shard = poptorch_shard(
            num_samples, combined_batch_size, num_processes, process_id, drop_last
        )
    _check_shuffle_seed(shuffle, seed, num_processes)
    e = _non_negative("epoch", epoch)
    offset = shard.offset
    if _rotates(shuffle, num_processes, rotate_leftovers) and e % 2 == 0:
        offset += shard.leftovers
    stop = offset + shard.length
    if not shuffle:
        return list(range(offset, stop))
    return list(_order(num_samples, seed, e)[offset:stop])


def topology_invariant_indices(
    num_samples: int,
    *,
    micro_batch_size: int,
    device_iterations: int,
    gradient_accumulation: int,
    local_replicas: int,
    num_processes: int,
    process_id: int,
    shuffle: bool = False,
    seed: int | None = None,
    epoch: int = 0,
    drop_last: bool = True,
    rotate_leftovers: bool | None = None,
    replica_counts: Sequence[int] | None = None,
) -> list[int]:
    """This process's samples in an order that does not depend on the replica split.

    With ``G = micro × DI × GA × local_replicas × num_processes``, global step ``s`` uses
    positions ``[s*G, (s+1)*G)`` of the (permuted) order, laid out as
    ``[device_iteration, accumulation, global_replica, micro_batch]``; this process owns
    ``local_replicas`` global replicas from ``process_id*local_replicas``, or, given
    ``replica_counts`` (every process's count: a non-uniform split), from the sum of the
    counts before it. The result is this process's combined batches concatenated, each in
    the executor's layout ``[device_iteration, accumulation, local_replica, micro_batch]``.

    Only whole global steps are read: with ``drop_last=False`` the dataset must hold a whole
    number of them. The ``N % G`` left-over positions are used on even epochs (by default when
    shuffling; ``rotate_leftovers`` decides explicitly).
    """
    n = _non_negative("num_samples", num_samples)
    micro = _positive("micro_batch_size", micro_batch_size)
    di = _positive("device_iterations", device_iterations)
    ga = _positive("gradient_accumulation", gradient_accumulation)
    local = _positive("local_replicas", local_replicas)
    procs = _positive("num_processes", num_processes)
    pid = _index("process_id", process_id, "num_processes", procs)
    _check_shuffle_seed(shuffle, seed, procs)
    e = _non_negative("epoch", epoch)
    replicas, first = _replicas_of(replica_counts, local, procs, pid)
    g = micro * di * ga * replicas
    product = f"micro_batch_size={micro} × device_iterations={di} × gradient_accumulation={ga}"
    steps, leftovers = _global_steps(n, g, drop_last, f"{product} × {replicas} replicas")
    # The default shift depends on ``shuffle`` only, never on the split, to stay invariant.
    rotate = shuffle if rotate_leftovers is None else rotate_leftovers
    base = leftovers if rotate and e % 2 == 0 else 0
    order: Sequence[int] = _order(n, seed, e) if shuffle else range(n)
    width = local * micro  # this process's contiguous run within one (di, ga) slot
    row = replicas * micro  # one (di, ga) slot over all replicas
    out: list[int] = []
    for step in range(steps):
        start = base + step * g + first * micro
        for slot in range(di * ga):
            at = start + slot * row
            out.extend(order[at : at + width])
    return out


def _replicas_of(
    replica_counts: Sequence[int] | None, local: int, procs: int, pid: int
) -> tuple[int, int]:
    """(all replicas, this process's first global replica), uniform or as counted."""
    if replica_counts is None:
        return local * procs, pid * local
    counts, _ = _counts(replica_counts, pid)
    if len(counts) != procs or counts[pid] != local:
        raise ShardingError(
            f"replica_counts={list(counts)} does not describe {procs} processes with "
            f"local_replicas={local} on process {pid}"
        )
    return sum(counts), sum(counts[:pid])


def _global_steps(n: int, g: int, drop_last: bool, product: str) -> tuple[int, int]:
    """Whole global steps of ``g`` samples in ``n``, and the left-over samples."""
    steps, leftovers = divmod(n, g)
    if steps == 0:
        raise ShardingError(
            f"num_samples={n} is fewer than one global step ({product} = {g}): "
            f"use a smaller batch or fewer replicas"
        )
    if leftovers and not drop_last:
        raise ShardingError(
            f"num_samples={n} is not a multiple of the global step size {g} and drop_last=False: "
            f"the topology-invariant order reads whole global steps only; use drop_last=True"
        )
    return steps, leftovers


def worker_shard(
    instance_index: int, num_instances: int, worker_id: int, num_workers: int
) -> tuple[int, int]:
    """``(shard_index, num_shards)`` of a DataLoader worker reading an IterableDataset.

    Shards are numbered worker-major within an instance: ``worker_id + num_workers *
    instance_index`` of ``num_workers * num_instances``, as Graphcore's BERT example does.
    """
    instances = _positive("num_instances", num_instances)
    workers = _positive("num_workers", num_workers)
    instance = _index("instance_index", instance_index, "num_instances", instances)
    worker = _index("worker_id", worker_id, "num_workers", workers)
    return worker + workers * instance, workers * instances
