"""The torch samplers a DataLoader feeds: an epoch's indices, or the user's micro-batches combined."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence, Sized

import torch
from torch.utils import data as tud

from popdist_torch.data.epoch_order import sampler_seed
from popdist_torch.errors import DataLoaderError

__all__ = ["CombiningBatchSampler", "EpochSampler", "join_micro_batches", "sampler_epoch"]


class EpochSampler(tud.Sampler[int]):
    """Yields the indices of the current epoch's order, from where the epoch resumes.

    Torch reads a sampler fixed at construction; the loader hands it each epoch's
    :class:`~popdist_torch.data.epoch_order.EpochOrder` (from the resumed batch on) before
    torch iterates it.
    """

    def __init__(self, length: int) -> None:
        self.indices: Sequence[int] = ()
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


def sampler_epoch(sampler: Iterable[int], seed: int | None, epoch: int) -> list[int]:
    """One epoch of ``sampler``'s indices, as every process draws it.

    ``seed`` (a sampler whose ``generator`` is ``None``, such as ``RandomSampler(ds)``): the
    epoch is drawn from a generator seeded from ``seed`` and ``epoch``, given to the sampler
    for the draw only (torch would draw from each process's own global generator); a sampler
    with no ``generator`` attribute draws from torch's global generator, so seeded for the
    draw and put back after it. Otherwise the sampler's own order, from its own generator
    where it has one.
    """
    if seed is None:
        return [int(i) for i in sampler]
    if not hasattr(sampler, "generator"):
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(sampler_seed(seed, epoch))
            return [int(i) for i in sampler]
    generator = torch.Generator()
    generator.manual_seed(sampler_seed(seed, epoch))
    sampler.generator = generator
    try:
        return [int(i) for i in sampler]
    finally:
        sampler.generator = None
