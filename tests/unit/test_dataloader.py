"""DataLoader against PopTorch's reference arithmetic (reference §3.3-3.4), 1-3 processes."""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import pytest
import torch
from torch.utils import data as tud

from popdist.sharding import epoch_permutation
from popdist_torch.data import DataLoader, current_shard
from popdist_torch.enums import DataLoaderMode
from tests.support.data import Stream, make_options

pytestmark = pytest.mark.unit


class Indices(tud.Dataset[torch.Tensor]):
    """Sample ``i`` is the tensor ``i``: batches show which indices were loaded."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.tensor(i)


def reference_epochs(
    n: int,
    combined: int,
    processes: int,
    pid: int,
    *,
    drop_last: bool,
    shuffle: bool,
    seed: int,
    epochs: int,
) -> list[list[list[int]]]:
    """PopTorch's batches per epoch, written from the reference's ``_SubDataset`` description.

    P > 1: contiguous blocks of ``combined * (n // (combined * P))`` samples (drop_last) or
    an even split; shuffled: the block is read through a permutation of the whole dataset,
    and shifted by the leftovers on alternate epochs. P == 1: torch's sampler over the
    whole dataset. The permutation itself is popdist's seeded ``epoch_permutation`` (PopTorch
    draws it from a torch generator instead), and the shift falls on even epochs (PopTorch's
    ``swap_range`` runs before every epoch, the first included).
    """
    if processes > 1 and drop_last:
        per = combined * (n // (combined * processes))
        base = pid * per
        length = min(per, n - base)
        leftovers = n % per
    elif processes > 1:
        sizes = [n // processes + (n % processes > p) for p in range(processes)]
        base, length, leftovers = sum(sizes[:pid]), sizes[pid], 0
    else:
        base, length, leftovers = 0, n, 0
    out = []
    for epoch in range(epochs):
        offset = base
        if shuffle:
            perm = epoch_permutation(n, seed, epoch)
            if processes > 1 and epoch % 2 == 0:
                offset = base + leftovers
            indices = [perm[i + offset] for i in range(length)]
        else:
            indices = [i + offset for i in range(length)]
        batches = [indices[i : i + combined] for i in range(0, length, combined)]
        if drop_last and batches and len(batches[-1]) < combined:
            batches.pop()
        out.append(batches)
    return out


def loaded(loader: Any, epochs: int) -> list[list[list[int]]]:
    return [[b.tolist() for b in loader] for _ in range(epochs)]


CASES = list(
    itertools.product(
        [1, 2, 3],  # processes
        [True, False],  # drop_last
        [False, True],  # shuffle
        [48, 53, 61],  # samples
    )
)


@pytest.mark.parametrize(("processes", "drop_last", "shuffle", "n"), CASES)
def test_batches_follow_poptorch_arithmetic(
    processes: int, drop_last: bool, shuffle: bool, n: int
) -> None:
    seed = 1234
    batch, di, replicas = 2, 2, 2
    combined = batch * di * replicas
    seen: list[set[int]] = [set() for _ in range(3)]
    for pid in range(processes):
        opts = make_options(pid, processes, device_iterations=di, replicas=replicas, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader = DataLoader(
                opts, Indices(n), batch_size=batch, shuffle=shuffle, drop_last=drop_last
            )
        assert loader.combinedBatchSize == combined
        expected = reference_epochs(
            n, combined, processes, pid, drop_last=drop_last, shuffle=shuffle, seed=seed, epochs=3
        )
        got = loaded(loader, 3)
        assert got == expected
        assert len(loader) == len(expected[0])
        for epoch, batches in enumerate(got):
            flat = [i for b in batches for i in b]
            assert not seen[epoch] & set(flat), "a sample went to two processes in one epoch"
            seen[epoch] |= set(flat)
    if shuffle and processes > 1 and drop_last and n % (combined * processes):
        # the leftover rotation makes the tail samples appear in alternate epochs
        assert seen[0] != seen[1]


def test_every_process_yields_the_same_number_of_batches_with_drop_last() -> None:
    for processes, n in [(2, 61), (3, 61), (3, 100)]:
        lengths = {
            len(DataLoader(make_options(p, processes), Indices(n), batch_size=4))
            for p in range(processes)
        }
        assert len(lengths) == 1


def test_cifar10_numbers_from_poptorch() -> None:
    """50 000 samples, batch 32: 8 replicas over 4 instances vs plain Options under mpirun -np 4."""
    popdist_style = make_options(1, 4, replicas=2)
    loader = DataLoader(popdist_style, Indices(50_000), batch_size=32)
    assert (len(loader), loader.combinedBatchSize) == (195, 64)
    plain = make_options(3, 4)
    loader = DataLoader(plain, Indices(50_000), batch_size=32)
    assert (len(loader), loader.combinedBatchSize) == (390, 32)


def test_combined_batch_includes_accumulation() -> None:
    opts = make_options(device_iterations=3, replicas=2, accumulation=4)
    loader = DataLoader(opts, Indices(500), batch_size=5)
    assert loader.combinedBatchSize == 5 * 3 * 2 * 4
    assert len(loader) == 500 // 120
    assert all(b.shape == (120,) for b in loader)


def test_options_are_frozen() -> None:
    opts = make_options()
    DataLoader(opts, Indices(8), batch_size=2)
    with pytest.raises(RuntimeError):
        opts.deviceIterations(2)


def test_single_process_seeded_shuffle_is_the_epoch_permutation() -> None:
    """P=1 with a seed: epoch e reads popdist's permutation for (seed, e), batch by batch."""
    loader = DataLoader(make_options(seed=7), Indices(22), batch_size=4, shuffle=True)
    for epoch, batches in enumerate(loaded(loader, 2)):
        perm = epoch_permutation(22, 7, epoch)
        assert batches == [perm[i : i + 4] for i in range(0, 20, 4)]


def test_unseeded_single_process_shuffle_differs_between_epochs() -> None:
    loader = DataLoader(make_options(), Indices(40), batch_size=4, shuffle=True)
    first, second = loaded(loader, 2)
    assert sorted(i for b in first for i in b) == list(range(40))
    assert first != second


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True])
def test_bad_batch_size_is_a_value_error(batch_size: Any) -> None:
    with pytest.raises(
        ValueError, match=rf"batch_size={batch_size!r} is invalid.*positive integer"
    ):
        DataLoader(make_options(), Indices(8), batch_size=batch_size)


def test_dataset_smaller_than_a_combined_batch() -> None:
    opts = make_options(0, 2, device_iterations=4)
    with pytest.raises(
        ValueError, match=r"dataset of 10 samples is smaller than one combined batch.*16"
    ):
        DataLoader(opts, Indices(10), batch_size=2)


def test_empty_dataset() -> None:
    with pytest.raises(ValueError, match="empty dataset"):
        DataLoader(make_options(), Indices(0), batch_size=1, drop_last=False)


def test_shuffle_with_processes_needs_a_seed() -> None:
    with pytest.raises(ValueError, match=r"shuffle=True with 2 processes needs Options.randomSeed"):
        DataLoader(make_options(0, 2), Indices(16), batch_size=2, shuffle=True)


def test_batch_size_none_needs_manual_partitioning() -> None:
    with pytest.raises(ValueError, match="batch_size=None is only allowed"):
        DataLoader(make_options(), Indices(8), batch_size=None)
    loader = DataLoader(
        make_options(), Indices(3), batch_size=None, auto_distributed_partitioning=False
    )
    assert loader.combinedBatchSize is None
    assert [int(x) for x in loader] == [0, 1, 2]


def test_bad_order() -> None:
    with pytest.raises(ValueError, match="order='random' is invalid"):
        DataLoader(make_options(), Indices(8), order="random")


def test_drop_last_false_warns_about_the_last_batch() -> None:
    with pytest.warns(
        UserWarning, match=r"last combined batch of this process will have 1 samples"
    ):
        DataLoader(make_options(0, 1), Indices(9), batch_size=2, drop_last=False)
    with pytest.warns(UserWarning, match=r"different numbers of batches \[1, 2\]"):
        DataLoader(make_options(0, 2), Indices(5), batch_size=2, drop_last=False)


def test_manual_partitioning_reads_everything() -> None:
    loader = DataLoader(
        make_options(1, 2), Indices(8), batch_size=2, auto_distributed_partitioning=False
    )
    assert loaded(loader, 1) == [[[0, 1], [2, 3], [4, 5], [6, 7]]]


# -- topology-invariant order --------------------------------------------------------------


def test_topology_invariant_order_gives_each_replica_the_same_samples() -> None:
    """Micro-batch k of global replica r holds the same samples under any instance split."""
    n, batch, di = 96, 2, 3

    def per_replica(processes: int, replicas: int) -> dict[tuple[int, int], list[int]]:
        out: dict[tuple[int, int], list[int]] = {}
        for pid in range(processes):
            opts = make_options(pid, processes, device_iterations=di, replicas=replicas)
            loader = DataLoader(opts, Indices(n), batch_size=batch, order="topology_invariant")
            for step, combined in enumerate(loader):
                # layout [device iteration, accumulation(1), replica, micro-batch]
                view = combined.view(di, replicas, batch)
                for d in range(di):
                    for r in range(replicas):
                        out[(step * di + d, pid * replicas + r)] = view[d, r].tolist()
        return out

    reference = per_replica(1, 4)
    assert per_replica(2, 2) == reference
    assert per_replica(4, 1) == reference


# -- batch_sampler, IterableDataset ----------------------------------------------------------


def test_batch_sampler_micro_batches_are_combined_and_dealt() -> None:
    micro = [[i, i + 1] for i in range(0, 40, 2)]  # 20 micro-batches of 2
    per_process: list[list[list[int]]] = []
    for pid in range(2):
        opts = make_options(pid, 2, device_iterations=2, replicas=2)  # 4 micro-batches per batch
        loader = DataLoader(opts, Indices(40), batch_sampler=micro)
        assert loader.combinedBatchSize is None
        got = loaded(loader, 1)[0]
        assert len(loader) == len(got) == 2  # 5 groups, 2 complete rounds of 2 processes
        per_process.append(got)
    assert per_process[0] == [list(range(0, 8)), list(range(16, 24))]
    assert per_process[1] == [list(range(8, 16)), list(range(24, 32))]


def test_batch_sampler_rejects_uneven_micro_batches() -> None:
    opts = make_options(replicas=2)
    loader = DataLoader(opts, Indices(10), batch_sampler=[[0, 1], [2]])
    with pytest.raises(ValueError, match=r"micro-batches of sizes \[1, 2\]"):
        list(loader)


def test_batch_sampler_excludes_batch_size() -> None:
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(make_options(), Indices(10), batch_size=2, batch_sampler=[[0, 1]])


@pytest.mark.parametrize("self_sharding", [False, True])
def test_iterable_dataset_is_sharded_by_instance(self_sharding: bool) -> None:
    shards = []
    for pid in range(3):
        loader = DataLoader(
            make_options(pid, 3),
            Stream(30, self_sharding),
            batch_size=2,
            auto_distributed_partitioning=not self_sharding,
        )
        shards.append([i for b in loader for i in b.tolist()])
    assert sorted(i for s in shards for i in s) == list(range(30))
    assert [len(s) for s in shards] == [10, 10, 10]


def test_current_shard_outside_iteration() -> None:
    assert current_shard() == (0, 1)


# -- Async modes -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [DataLoaderMode.Async, DataLoaderMode.AsyncRebatched])
@pytest.mark.parametrize("drop_last", [True, False])
def test_async_modes_yield_what_sync_yields(mode: DataLoaderMode, drop_last: bool) -> None:
    def build(m: DataLoaderMode, **extra: Any) -> DataLoader:
        opts = make_options(1, 2, replicas=2, seed=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return DataLoader(
                opts, Indices(45), batch_size=2, shuffle=True, drop_last=drop_last, mode=m, **extra
            )

    extra = {"rebatched_worker_size": 2} if mode == DataLoaderMode.AsyncRebatched else {}
    sync, asynchronous = build(DataLoaderMode.Sync), build(mode, **extra)
    assert len(asynchronous) == len(sync)
    assert loaded(asynchronous, 3) == loaded(sync, 3)
    asynchronous.terminate()


def test_rebatched_worker_size_must_divide_the_combined_batch() -> None:
    with pytest.raises(
        ValueError,
        match=r"rebatched_worker_size=3 is invalid.*divisor of the combined batch size 8",
    ):
        DataLoader(
            make_options(replicas=4),
            Indices(16),
            batch_size=2,
            mode=DataLoaderMode.AsyncRebatched,
            rebatched_worker_size=3,
        )


def test_unknown_async_option() -> None:
    with pytest.raises(ValueError, match=r"unknown keys \['bufer_size'\]"):
        DataLoader(
            make_options(), Indices(16), mode=DataLoaderMode.Async, async_options={"bufer_size": 2}
        )


# -- data-order state ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [DataLoaderMode.Sync, DataLoaderMode.Async])
def test_resume_mid_epoch_continues_the_same_order(mode: DataLoaderMode) -> None:
    def build() -> DataLoader:
        return DataLoader(
            make_options(0, 2, seed=11), Indices(50), batch_size=3, shuffle=True, mode=mode
        )

    full = build()
    reference = loaded(full, 3)
    partial = build()
    loaded(partial, 1)
    it = iter(partial)
    next(it)
    next(it)
    state = partial.state_dict()
    assert state["epoch"] == 1 and state["batch"] == 2
    partial.terminate()

    resumed = build()
    resumed.load_state_dict(state)
    rest = [b.tolist() for b in resumed]
    assert rest == reference[1][2:]
    assert resumed.state_dict()["epoch"] == 2
    assert loaded(resumed, 1) == [reference[2]]
    full.terminate()
    resumed.terminate()


def test_state_after_a_complete_epoch_points_at_the_next() -> None:
    loader = DataLoader(make_options(), Indices(12), batch_size=4)
    for _ in loader:
        pass
    state = loader.state_dict()
    assert (state["epoch"], state["batch"], state["seed"]) == (1, 0, None)


def test_iteration_leaves_the_global_generator_alone() -> None:
    """Creating an epoch's iterator draws nothing from torch's global generator."""
    loader = DataLoader(make_options(seed=3), Indices(12), batch_size=4, num_workers=0)
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    next(iter(loader))
    assert torch.equal(torch.rand(1), expected)


def _epoch_rest(loader: DataLoader) -> list[int]:
    return [i for batch in loader for i in batch.tolist()]


def test_resume_on_another_topology_mid_epoch_is_refused() -> None:
    # 1 instance × 4 replicas saved after 2 of 8 combined batches, resumed as 2 × 4:
    # PopTorch's order would hand out other samples (16 skipped, 16 repeated). Refused.
    saver = DataLoader(make_options(0, 1, replicas=4, seed=1), Indices(128), batch_size=4,
                       shuffle=True)  # fmt: skip
    it = iter(saver)
    next(it), next(it)
    state = saver.state_dict()
    assert state["topology"]["processes"] == 1 and state["topology"]["local_replicas"] == 4
    wider = DataLoader(make_options(1, 2, replicas=4, seed=1), Indices(128), batch_size=4,
                       shuffle=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"mid-epoch \(batch 2\).*skip or repeat samples"):
        wider.load_state_dict(state)
    same = DataLoader(make_options(0, 1, replicas=4, seed=1), Indices(128), batch_size=4,
                      shuffle=True)  # fmt: skip
    same.load_state_dict(state)  # the same topology resumes as before
    assert len(_epoch_rest(same)) == 128 - 32


def test_resume_on_another_topology_is_exact_with_the_topology_invariant_order() -> None:
    def loader(pid: int, processes: int) -> DataLoader:
        return DataLoader(make_options(pid, processes, replicas=4, seed=1), Indices(128),
                          batch_size=4, shuffle=True, order="topology_invariant")  # fmt: skip

    saver = loader(0, 1)
    it = iter(saver)
    seen = [i for _ in range(2) for i in next(it).tolist()]
    state = saver.state_dict()
    rest = [_epoch_rest(_resumed(loader(pid, 2), state)) for pid in range(2)]
    assert sorted(seen + rest[0] + rest[1]) == list(range(128))  # none skipped, none twice
    odd = DataLoader(make_options(0, 1, replicas=4, seed=1), Indices(128), batch_size=4,
                     shuffle=True, order="topology_invariant")  # fmt: skip
    it = iter(odd)
    next(it)  # 16 samples consumed: not a whole step of 2 × 4 replicas (32)
    with pytest.raises(ValueError, match="skip or repeat"):
        loader(0, 2).load_state_dict(odd.state_dict())


def _resumed(loader: DataLoader, state: dict) -> DataLoader:
    loader.load_state_dict(state)
    return loader


def test_an_uneven_split_gives_each_instance_its_replicas_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """6 replicas as (2, 2, 1, 1): combined batches follow each instance's replicas, and the
    topology-invariant order gives every global replica what 1 instance × 6 gives it."""
    import popdist
    import popdist.poptorch
    from tests.support.instance_env import as_instance

    def replica_samples(local: int, first: int, batches: list[list[int]]) -> dict:  # type: ignore[type-arg]
        out = {}
        for step, batch in enumerate(batches):
            for r in range(local):
                out[(step, first + r)] = batch[r * 2 : (r + 1) * 2]
        return out

    def load(**kw: Any) -> list[list[int]]:
        opts = popdist.poptorch.Options().randomSeed(5)
        loader = DataLoader(
            opts, Indices(50), batch_size=2, shuffle=True, order="topology_invariant", **kw
        )
        return [b.tolist() for b in loader]

    whole = {}
    seen: dict[tuple[int, int], list[int]] = {}
    for index in range(4):
        as_instance(monkeypatch, replicas=6, instances=4, index=index, uneven=True)
        local, first = popdist.getNumLocalReplicas(), popdist.getReplicaIndexOffset()
        assert (local, first) == [(2, 0), (2, 2), (1, 4), (1, 5)][index]
        assert popdist.getDeviceId() == 8 + index  # groups of 2 devices, sized for the largest
        batches = load()
        assert len(batches) == 50 // 12 and {len(b) for b in batches} == {2 * local}
        seen.update(replica_samples(local, first, batches))
    as_instance(monkeypatch, replicas=6, instances=1, index=0)
    whole = replica_samples(6, 0, load())
    assert seen == whole
