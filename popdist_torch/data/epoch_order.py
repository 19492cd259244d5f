"""The order of one epoch: an immutable value computed once, when the epoch starts.

:class:`EpochOrder` holds everything that decides which samples this instance loads in an
epoch and in which order: the epoch, the shuffle seed, this instance's sample indices (its
shard of the epoch's permutation, the leftovers rotation included) and the seed of torch's
worker generator for the epoch. The ``DataLoader`` computes one per ``__iter__`` from its
frozen :class:`~popdist_torch.data.plan.LoaderPlan` and its :class:`Seeds`, and feeds it to
torch; nothing writes into it afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from popdist import sharding
from popdist_torch.data.plan import ORDER_TOPOLOGY_INVARIANT, LoaderPlan

__all__ = ["EpochOrder", "Seeds", "draw_seed", "sampled_indices", "sampler_seed", "shard_indices"]


def draw_seed() -> int:
    """A seed from torch's global generator (what torch's own shuffling draws from)."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


@dataclass(frozen=True)
class Seeds:
    """The loader's two seeds: of the shuffle order, and of torch's worker generator.

    ``None`` until there is one: ``Options.randomSeed`` gives both; without it the worker
    seed is drawn when the loader is built, the shuffle seed when it is first needed, both
    from torch's global generator. Checkpoints save and restore them.
    """

    shuffle: int | None = None
    worker: int | None = None

    def with_shuffle_seed(self) -> Seeds:
        """These seeds, with a shuffle seed drawn if there was none."""
        return self if self.shuffle is not None else dataclasses.replace(self, shuffle=draw_seed())


def shard_indices(plan: LoaderPlan, epoch: int, seed: int | None) -> list[int]:
    """This instance's sample indices for ``epoch``, in the order they are loaded."""
    assert plan.num_samples is not None and plan.combined is not None
    n, processes, process_id = plan.num_samples, plan.processes, plan.shard_id
    seed = seed if plan.shuffle else None
    if plan.order == ORDER_TOPOLOGY_INVARIANT:
        di, r, ga = plan.topology
        assert plan.batch_size is not None
        return sharding.topology_invariant_indices(
            n,
            micro_batch_size=plan.batch_size,
            device_iterations=di,
            gradient_accumulation=ga,
            local_replicas=r,
            num_processes=processes,
            process_id=process_id,
            shuffle=plan.shuffle,
            seed=seed,
            epoch=epoch,
            drop_last=plan.drop_last,
            replica_counts=plan.replica_counts if plan.auto else None,
        )
    if processes > 1:
        return sharding.process_indices(
            n,
            plan.combined,
            processes,
            process_id,
            drop_last=plan.drop_last,
            shuffle=plan.shuffle,
            seed=seed,
            epoch=epoch,
            replica_counts=plan.replica_counts if plan.auto else None,
        )
    if plan.shuffle:
        assert seed is not None
        return sharding.epoch_permutation(n, seed, epoch)
    return list(range(n))


def sampled_indices(plan: LoaderPlan, sequence: Sequence[int]) -> list[int]:
    """This instance's part of ``sequence``, one epoch of the user's sampler, in load order.

    The rule a ``batch_sampler``'s micro-batches follow: every process draws the same
    sequence; consecutive runs of the processes' combined batches form rounds, and process
    ``p`` takes the ``p``-th run of each round (``[p0 p1 p2 p0 p1 p2 ...]``, each run one
    combined batch of that process). With ``drop_last`` only whole rounds are used, so every
    process loads as many batches; without, the last round is cut short. The topology-invariant
    order takes instead the positions of :func:`popdist.sharding.topology_invariant_indices`.
    """
    n = len(sequence)
    if plan.order == ORDER_TOPOLOGY_INVARIANT:
        di, r, ga = plan.topology
        assert plan.batch_size is not None
        positions = sharding.topology_invariant_indices(
            n,
            micro_batch_size=plan.batch_size,
            device_iterations=di,
            gradient_accumulation=ga,
            local_replicas=r,
            num_processes=plan.processes,
            process_id=plan.shard_id,
            drop_last=plan.drop_last,
            rotate_leftovers=False,
            replica_counts=plan.replica_counts if plan.auto else None,
        )
        return [int(sequence[i]) for i in positions]
    sizes = plan.combined_sizes()
    width, offset, size = sum(sizes), sum(sizes[: plan.shard_id]), sizes[plan.shard_id]
    rounds = n // width if plan.drop_last else -(-n // width)
    starts = (r * width + offset for r in range(rounds))
    return [int(i) for start in starts for i in sequence[start : start + size]]


def sampler_seed(seed: int, epoch: int) -> int:
    """The seed of the generator a sampler draws epoch ``epoch``'s order from (``seeds_sampler``)."""
    return (seed * 1_000_003 + epoch * 7_919 + 1) % 2**63


@dataclass(frozen=True)
class EpochOrder:
    """What one epoch loads, decided when it starts.

    ``indices``: this instance's samples in load order (``None`` when the loader does not
    choose samples by index: a ``batch_sampler``, an ``IterableDataset``, the user's
    sampler). ``worker_seed``: what torch's worker generator is seeded with for the epoch
    (``None``: the user gave torch a generator).
    """

    epoch: int
    seed: int | None
    indices: tuple[int, ...] | None
    worker_seed: int | None

    @classmethod
    def of(
        cls, plan: LoaderPlan, epoch: int, seeds: Seeds, sequence: Sequence[int] | None = None
    ) -> EpochOrder:
        """The order of ``epoch`` under ``plan`` (``seeds.shuffle`` drawn already if needed);
        ``sequence``: the epoch of the user's sampler (source ``SAMPLED``)."""
        indices = None
        if sequence is not None:
            indices = tuple(sampled_indices(plan, sequence))
        elif plan.by_index:
            indices = tuple(shard_indices(plan, epoch, seeds.shuffle))
        worker_seed = None
        if plan.private_generator:
            assert seeds.worker is not None
            worker_seed = (seeds.worker * 1_000_003 + epoch * 7_919 + plan.process_id) % 2**63
        return cls(epoch, seeds.shuffle, indices, worker_seed)

    def from_batch(self, batch: int, combined: int) -> tuple[int, ...]:
        """The indices left from combined batch ``batch`` on (to resume mid-epoch)."""
        assert self.indices is not None
        return self.indices[batch * combined :]
