"""Any ``sampler`` with automatic partitioning over several processes is sharded (issue 54).

Each process takes its part of the sampler's epoch by the ``batch_sampler`` rule: rounds of
the processes' combined batches, process ``p`` the ``p``-th of each round. Here the processes
are simulated (``configureProcessId``); tests/parallel/test_sampler_shards.py runs them under
poprun. Over 1, 2 and 3 processes the union is the single-process epoch, with no sample twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils import data as tud

from popdist_torch.data import DataLoader, DataLoaderError
from popdist_torch.data.samplers import sampler_epoch
from tests.support.data import make_options

pytestmark = pytest.mark.unit

SEED = 11


class Indices(tud.Dataset[torch.Tensor]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


class EveryThirdFirst(tud.Sampler[int]):
    """A user's own sampler: a fixed order, not torch's."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter([*range(0, self.n, 3), *range(1, self.n, 3), *range(2, self.n, 3)])

    def __len__(self) -> int:
        return self.n


def make_sampler(kind: str, dataset: Indices) -> Any:
    if kind == "sequential":
        return tud.SequentialSampler(dataset)
    if kind == "random":  # optimum-graphcore's train sampler: no generator of its own
        return tud.RandomSampler(dataset)
    if kind == "random_own_generator":  # every process seeds its own the same way
        return tud.RandomSampler(dataset, generator=torch.Generator().manual_seed(3))
    if kind == "subset_random":
        return tud.SubsetRandomSampler(list(range(0, len(dataset), 2)))
    return EveryThirdFirst(len(dataset))


KINDS = ("sequential", "random", "random_own_generator", "subset_random", "own")


def single_process_epoch(kind: str, n: int, epoch: int) -> list[int]:
    """The sampler's epoch as one process draws it (the loader's seed for an unseeded one)."""
    sampler = make_sampler(kind, Indices(n))
    for e in range(epoch):  # a generator of its own moves on with every epoch drawn
        sampler_epoch(sampler, SEED if kind in ("random", "subset_random") else None, e)
    return sampler_epoch(sampler, SEED if kind in ("random", "subset_random") else None, epoch)


def epochs(
    kind: str, n: int, processes: int, *, epochs_: int = 2, **kw: Any
) -> list[list[list[list[int]]]]:
    """``[process][epoch][batch]`` -> the indices each simulated process loads."""
    out = []
    replicas = kw.pop("replicas", 1)
    for p in range(processes):
        dataset = Indices(n)
        options = make_options(p, processes, replicas=replicas, seed=SEED)
        loader = DataLoader(
            options, dataset, batch_size=2, sampler=make_sampler(kind, dataset), **kw
        )
        out.append([[b.tolist() for b in loader] for _ in range(epochs_)])
    return out


def interleave(per_process: list[list[list[int]]]) -> list[int]:
    """The processes' batches in round order: batch 0 of p0, p1, ..., then batch 1, ..."""
    rounds = zip(*per_process, strict=True)
    return [i for batches in rounds for batch in batches for i in batch]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("processes", [1, 2, 3])
def test_the_union_over_processes_is_the_single_process_epoch(kind: str, processes: int) -> None:
    n = 26
    found = epochs(kind, n, processes)
    for epoch in range(2):
        per_process = [p[epoch] for p in found]
        assert len({len(batches) for batches in per_process}) == 1  # as many batches each
        got = interleave(per_process)
        assert len(got) == len(set(got))  # no sample twice
        if processes == 1 and kind in ("random", "subset_random"):
            # one process, PopTorch's order: torch draws the order itself, as before
            assert len(got) == len(make_sampler(kind, Indices(n))) // 2 * 2
            continue
        expected = single_process_epoch(kind, n, epoch)
        width = 2 * processes
        assert got == expected[: len(expected) // width * width]


def test_shuffled_epochs_differ_and_repeat_with_the_seed() -> None:
    first, again = epochs("random", 40, 2), epochs("random", 40, 2)
    assert first == again
    assert interleave([p[0] for p in first]) != interleave([p[1] for p in first])


@pytest.mark.parametrize("kind", ["sequential", "random", "own"])
def test_the_topology_invariant_order_is_the_same_for_any_split(kind: str) -> None:
    n, global_batch = 24, 12  # 2 samples x 6 replicas
    reference = None
    for processes, replicas in ((1, 6), (2, 3), (3, 2)):
        found = epochs(kind, n, processes, replicas=replicas, order="topology_invariant")
        per_process = [p[0] for p in found]
        steps = []
        for step in zip(*per_process, strict=True):
            # each process's combined batch is its replicas' micro-batches in replica order
            steps.append([i for batch in step for i in batch])
        assert all(len(s) == global_batch for s in steps)
        if reference is None:
            reference = steps
            if kind != "random":
                expected = single_process_epoch(kind, n, 0)
                assert [i for s in steps for i in s] == expected
        assert steps == reference, (processes, replicas)


def test_an_unseeded_random_sampler_over_processes_needs_the_random_seed() -> None:
    dataset = Indices(8)
    options = make_options(0, 2)  # no randomSeed
    with pytest.raises(DataLoaderError, match=r"randomSeed\(<int>\)"):
        DataLoader(options, dataset, batch_size=2, sampler=tud.RandomSampler(dataset))
    seeded = tud.RandomSampler(dataset, generator=torch.Generator().manual_seed(0))
    assert len(DataLoader(options, dataset, batch_size=2, sampler=seeded)) == 2


def test_sampler_errors_name_the_fix() -> None:
    dataset = Indices(8)
    with pytest.raises(DataLoaderError, match="len\\(sampler\\)"):
        DataLoader(make_options(0, 2, seed=1), dataset, batch_size=2, sampler=iter(range(8)))
    with pytest.raises(DataLoaderError, match="mutually exclusive with shuffle"):
        DataLoader(make_options(), dataset, batch_size=2, sampler=range(8), shuffle=True)
    with pytest.raises(DataLoaderError, match="every epoch would be empty"):
        DataLoader(make_options(0, 2, seed=1), dataset, batch_size=8, sampler=range(8))
    with pytest.warns(UserWarning, match="not a whole number of rounds"):
        loader = DataLoader(
            make_options(1, 2, seed=1), dataset, batch_size=3, sampler=range(8), drop_last=False
        )
    assert [b.tolist() for b in loader] == [[3, 4, 5]]  # round 1 is 6, 7 for process 0 only


def test_the_users_generator_is_left_as_it_was() -> None:
    dataset = Indices(12)
    sampler = tud.RandomSampler(dataset)
    loader = DataLoader(make_options(0, 2, seed=4), dataset, batch_size=2, sampler=sampler)
    list(loader)
    assert sampler.generator is None


def test_a_sharded_sampler_resumes_mid_epoch() -> None:
    dataset = Indices(24)

    def loader() -> DataLoader:
        sampler = tud.RandomSampler(dataset)
        return DataLoader(make_options(1, 2, seed=5), dataset, batch_size=2, sampler=sampler)

    first = loader()
    whole = [[b.tolist() for b in first] for _ in range(2)]
    interrupted = loader()
    list(interrupted)
    it = iter(interrupted)
    next(it)
    state = interrupted.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 1)
    resumed = loader()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == whole[1][1:]


def test_a_distributed_sampler_is_refused_where_the_loader_shards_it() -> None:
    dataset = Indices(8)
    split = tud.DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=False)
    with pytest.raises(DataLoaderError, match=r"DistributedSampler\) is already split per process"):
        DataLoader(make_options(0, 2, seed=1), dataset, batch_size=2, sampler=split)
    kept = DataLoader(
        make_options(0, 2, seed=1),
        dataset,
        batch_size=2,
        sampler=split,
        auto_distributed_partitioning=False,
    )
    assert [b.tolist() for b in kept] == [[0, 2], [4, 6]]  # its own split, as it is


class GlobalRandom(tud.Sampler[int]):
    """A user's random sampler with no ``generator``: torch's global generator decides."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def test_a_sampler_without_a_generator_is_seeded_by_the_loader() -> None:
    """Each process's global generator differs; the loader seeds the draw, so the union over
    the processes is one permutation, and the global generator is left where it was."""
    n = 24
    with pytest.raises(DataLoaderError, match=r"randomSeed\(<int>\)"):
        DataLoader(make_options(0, 2), Indices(n), batch_size=2, sampler=GlobalRandom(n))
    per_process = []
    for p in range(2):
        loader = DataLoader(
            make_options(p, 2, seed=SEED), Indices(n), batch_size=2, sampler=GlobalRandom(n)
        )
        torch.manual_seed(100 + p)  # what each process drew before differs
        state = torch.get_rng_state()
        per_process.append([b.tolist() for b in loader])
        assert torch.equal(torch.get_rng_state(), state)
    got = interleave(per_process)
    assert sorted(got) == list(range(n)) and got != list(range(n))
