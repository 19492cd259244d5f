"""Sharding arithmetic: PopTorch's formulas, properties of the shards, topology invariance."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from popdist.env import PopdistError, split_replicas
from popdist.sharding import (
    Shard,
    ShardingError,
    combined_batch_size,
    epoch_permutation,
    global_batch_size,
    poptorch_shard,
    process_indices,
    split_shard,
    topology_invariant_indices,
    worker_shard,
)

pytestmark = pytest.mark.unit

sizes = st.integers(min_value=0, max_value=600)
steps = st.integers(min_value=1, max_value=24)
procs = st.integers(min_value=1, max_value=8)
seeds = st.integers(min_value=-(2**40), max_value=2**40)


# --- batch sizes -----------------------------------------------------------------------------


def test_combined_batch_size_is_poptorch_product() -> None:
    assert combined_batch_size(32) == 32
    assert combined_batch_size(32, device_iterations=4, local_replicas=2) == 256
    assert combined_batch_size(2, 3, 5, 7) == 210


def test_global_batch_size_counts_all_instances() -> None:
    # bert args.py: replicas_local * ga * micro * num_instances
    assert global_batch_size(8, local_replicas=2, gradient_accumulation=16, num_instances=4) == 1024
    assert global_batch_size(1) == 1


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: combined_batch_size(0), "batch_size=0"),
        (lambda: combined_batch_size(4, device_iterations=-1), "device_iterations=-1"),
        (lambda: combined_batch_size(4, local_replicas=True), "local_replicas=True"),
        (lambda: global_batch_size(4, gradient_accumulation=0), "gradient_accumulation=0"),
        (lambda: global_batch_size(4, num_instances=2.0), "num_instances=2.0"),  # type: ignore[arg-type]
        (lambda: poptorch_shard(-1, 4, 2, 0), "num_samples=-1"),
        (lambda: poptorch_shard(100, 4, 2, 2), "process_id=2"),
        (lambda: poptorch_shard(100, 4, 0, 0), "num_processes=0"),
        (lambda: process_indices(100, 4, 2, 0, epoch=-1), "epoch=-1"),
        (lambda: worker_shard(4, 4, 0, 2), "instance_index=4"),
        (lambda: worker_shard(0, 4, 3, 2), "worker_id=3"),
        (lambda: epoch_permutation(10, "7", 0), "seed='7'"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_name_the_argument_and_value(call: object, needle: str) -> None:
    with pytest.raises(ShardingError, match=needle.replace("(", r"\(")) as info:
        call()  # type: ignore[operator]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, PopdistError)


def test_shuffle_over_processes_requires_a_seed_naming_random_seed() -> None:
    with pytest.raises(ShardingError, match=r"randomSeed\(\)"):
        process_indices(100, 4, 2, 0, shuffle=True)
    with pytest.raises(ShardingError, match=r"randomSeed\(\)"):
        topology_invariant_indices(
            100,
            micro_batch_size=1,
            device_iterations=1,
            gradient_accumulation=1,
            local_replicas=1,
            num_processes=2,
            process_id=0,
            shuffle=True,
        )
    # One process needs no agreement: an unseeded shuffle is allowed and is a permutation.
    assert sorted(process_indices(10, 1, 1, 0, shuffle=True)) == list(range(10))


def test_dataset_smaller_than_one_step_per_process_is_an_error() -> None:
    with pytest.raises(ShardingError, match=r"num_samples=7 .* = 8"):
        poptorch_shard(7, 4, 2, 0)
    assert poptorch_shard(7, 4, 2, 1, drop_last=False) == Shard(offset=4, length=3, leftovers=0)


# --- PopTorch's formulas ---------------------------------------------------------------------


def test_cifar10_worked_numbers() -> None:
    """Reference §3.4: 50 000 samples, B=32, 8 replicas over 4 instances."""
    # plain poptorch.Options (replicationFactor 1, 4 processes): 390 batches of 32
    plain = poptorch_shard(50_000, 32, 4, 3)
    assert plain.length // 32 == 390
    # popdist Options: 2 local replicas, combined 64, 195 batches per instance
    step = combined_batch_size(32, local_replicas=2)
    shards = [poptorch_shard(50_000, step, 4, p) for p in range(4)]
    assert [s.length // step for s in shards] == [195] * 4
    assert [s.offset for s in shards] == [0, 12_480, 24_960, 37_440]
    assert shards[0].leftovers == 50_000 % 12_480 == 80


@given(n=sizes, step=steps, p_count=procs, data=st.data())
def test_drop_last_reproduces_poptorch_formula(
    n: int, step: int, p_count: int, data: st.DataObject
) -> None:
    assume(n >= step * p_count)
    pid = data.draw(st.integers(0, p_count - 1))
    shard = poptorch_shard(n, step, p_count, pid)
    per_proc = step * (n // (step * p_count))
    assert shard == Shard(pid * per_proc, min(per_proc, n - pid * per_proc), n % per_proc)


@given(n=sizes, p_count=procs, data=st.data())
def test_no_drop_last_reproduces_poptorch_formula(
    n: int, p_count: int, data: st.DataObject
) -> None:
    pid = data.draw(st.integers(0, p_count - 1))
    per_proc = [n // p_count + (n % p_count > p) for p in range(p_count)]
    shard = poptorch_shard(n, 5, p_count, pid, drop_last=False)
    assert shard == Shard(sum(per_proc[:pid]), per_proc[pid], 0)


# --- shard properties --------------------------------------------------------------------------


@given(
    n=sizes,
    step=steps,
    p_count=procs,
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=seeds,
    epoch=st.integers(0, 5),
)
def test_shards_are_disjoint_and_cover_exactly_the_kept_samples(
    n: int, step: int, p_count: int, drop_last: bool, shuffle: bool, seed: int, epoch: int
) -> None:
    assume(not drop_last or n >= step * p_count)
    parts = [
        process_indices(
            n, step, p_count, p, drop_last=drop_last, shuffle=shuffle, seed=seed, epoch=epoch
        )
        for p in range(p_count)
    ]
    union = [i for part in parts for i in part]
    assert len(union) == len(set(union)), "shards overlap"
    kept = step * (n // (step * p_count)) * p_count if drop_last else n
    assert len(union) == kept
    # The kept samples: a contiguous window of the (permuted) order.
    shard0 = poptorch_shard(n, step, p_count, 0, drop_last)
    start = shard0.offset + (shard0.leftovers if shuffle and p_count > 1 and epoch % 2 == 0 else 0)
    order = epoch_permutation(n, seed, epoch) if shuffle else list(range(n))
    assert sorted(union) == sorted(order[start : start + kept])
    if drop_last:
        assert {len(part) for part in parts} == {kept // p_count}
        assert all(len(part) % step == 0 for part in parts)


@given(n=sizes, step=steps, p_count=st.integers(2, 8), seed=seeds)
def test_every_sample_used_over_two_epochs_when_leftovers_rotate(
    n: int, step: int, p_count: int, seed: int
) -> None:
    per_proc = step * (n // (step * p_count)) if n >= step * p_count else 0
    # The shift by ``N % per_proc`` reaches the whole tail when the tail is shorter than one
    # block (N // per_proc == P); PopTorch's formula cannot do better otherwise.
    assume(per_proc and n // per_proc == p_count)
    for shuffle, rotate in ((True, None), (False, True)):
        seen_samples: set[int] = set()
        for epoch in (0, 1):
            order = epoch_permutation(n, seed, epoch) if shuffle else list(range(n))
            pos = {sample: i for i, sample in enumerate(order)}
            for p in range(p_count):
                idx = process_indices(
                    n,
                    step,
                    p_count,
                    p,
                    shuffle=shuffle,
                    seed=seed,
                    epoch=epoch,
                    rotate_leftovers=rotate,
                )
                seen_samples.update(pos[i] for i in idx)
        assert seen_samples == set(range(n)), "some positions never read in two epochs"


def test_rotation_without_shuffle_uses_every_sample() -> None:
    # 10 samples, step 3, 2 processes: per_proc = 3 * (10 // 6) = 3, blocks [0,3) [3,6);
    # leftovers = 10 % 3 = 1, so even epochs read [1,4) [4,7) when the leftovers rotate.
    assert process_indices(10, 3, 2, 1, epoch=0) == [3, 4, 5]  # no shuffle: PopTorch keeps still
    assert process_indices(10, 3, 2, 1, epoch=0, rotate_leftovers=True) == [4, 5, 6]
    assert process_indices(10, 3, 2, 1, epoch=1, rotate_leftovers=True) == [3, 4, 5]
    # 13 samples, step 3, 2 processes: per_proc 6, leftovers 1, tail [12, 13) used on even epochs
    used = {
        i
        for epoch in (0, 1)
        for p in (0, 1)
        for i in process_indices(13, 3, 2, p, epoch=epoch, rotate_leftovers=True)
    }
    assert used == set(range(13))


def test_shuffled_rotation_alternates_epochs() -> None:
    n, step, p_count, seed = 13, 3, 2, 5
    for epoch in range(4):
        order = epoch_permutation(n, seed, epoch)
        shift = 1 if epoch % 2 == 0 else 0  # PopTorch's swap_range precedes every epoch
        assert (
            process_indices(n, step, p_count, 1, shuffle=True, seed=seed, epoch=epoch)
            == (order[6 + shift : 12 + shift])
        )


# --- the permutation -------------------------------------------------------------------------


@given(n=st.integers(0, 300), seed=seeds, epoch=st.integers(0, 50))
def test_epoch_permutation_is_a_deterministic_permutation(n: int, seed: int, epoch: int) -> None:
    perm = epoch_permutation(n, seed, epoch)
    assert sorted(perm) == list(range(n))
    assert perm == epoch_permutation(n, seed, epoch)


def test_epoch_permutation_changes_with_epoch_and_seed_and_is_stable() -> None:
    a = epoch_permutation(1000, 42, 0)
    assert a != epoch_permutation(1000, 42, 1)
    assert a != epoch_permutation(1000, 43, 0)
    # Pinned: the order must not change between releases or platforms (a restarted run
    # must see the same data). This is random.Random's documented-stable str seeding.
    assert epoch_permutation(10, 42, 0) == _PINNED_10_42_0


# --- topology invariance -----------------------------------------------------------------------


def _invariant(
    n: int, micro: int, di: int, ga: int, local: int, p_count: int, pid: int, **kw: object
) -> list[int]:
    return topology_invariant_indices(
        n,
        micro_batch_size=micro,
        device_iterations=di,
        gradient_accumulation=ga,
        local_replicas=local,
        num_processes=p_count,
        process_id=pid,
        **kw,  # type: ignore[arg-type]
    )


def _per_replica(
    n: int, micro: int, di: int, ga: int, local: int, p_count: int, **kw: object
) -> dict[tuple[int, int, int, int], list[int]]:
    """(step, di, ga, global replica) -> the micro-batch that replica sees there."""
    out: dict[tuple[int, int, int, int], list[int]] = {}
    combined = micro * di * ga * local
    for pid in range(p_count):
        flat = _invariant(n, micro, di, ga, local, p_count, pid, **kw)
        assert len(flat) % combined == 0
        for s in range(len(flat) // combined):
            batch = flat[s * combined : (s + 1) * combined]
            for d in range(di):
                for a in range(ga):
                    for r in range(local):
                        start = ((d * ga + a) * local + r) * micro
                        out[(s, d, a, pid * local + r)] = batch[start : start + micro]
    return out


def _divisors(k: int) -> list[int]:
    return [d for d in range(1, k + 1) if k % d == 0]


@settings(max_examples=60)
@given(
    total=st.sampled_from([1, 2, 4, 6, 8, 12]),
    micro=st.integers(1, 3),
    di=st.integers(1, 3),
    ga=st.integers(1, 3),
    extra=st.integers(0, 40),
    steps_=st.integers(1, 4),
    shuffle=st.booleans(),
    seed=seeds,
    epoch=st.integers(0, 3),
    data=st.data(),
)
def test_every_replica_sees_the_same_samples_whatever_the_split(
    total: int,
    micro: int,
    di: int,
    ga: int,
    extra: int,
    steps_: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    data: st.DataObject,
) -> None:
    n = steps_ * micro * di * ga * total + extra
    p1, p2 = (
        data.draw(st.sampled_from(_divisors(total))),
        data.draw(st.sampled_from(_divisors(total))),
    )
    kw = {"shuffle": shuffle, "seed": seed, "epoch": epoch}
    a = _per_replica(n, micro, di, ga, total // p1, p1, **kw)
    b = _per_replica(n, micro, di, ga, total // p2, p2, **kw)
    assert a == b
    g = micro * di * ga * total
    assert len(a) == (n // g) * di * ga * total
    flat = [i for mb in a.values() for i in mb]
    assert len(flat) == len(set(flat)) == (n // g) * g


def test_topology_invariant_layout_small_example() -> None:
    # micro 1, DI 2, GA 1, 4 replicas as 2 processes x 2: step 0 holds positions 0..7,
    # laid out [di, replica]: di0 -> 0 1 2 3, di1 -> 4 5 6 7; process 1 owns replicas 2, 3.
    assert _invariant(16, 1, 2, 1, 2, 2, 1) == [2, 3, 6, 7, 10, 11, 14, 15]
    assert _invariant(16, 1, 2, 1, 2, 2, 0) == [0, 1, 4, 5, 8, 9, 12, 13]


@given(
    n=st.integers(1, 400),
    micro=st.integers(1, 4),
    di=st.integers(1, 3),
    ga=st.integers(1, 3),
    local=st.integers(1, 4),
    shuffle=st.booleans(),
    seed=seeds,
    epoch=st.integers(0, 3),
)
def test_one_process_topology_invariant_equals_poptorch_order(
    n: int, micro: int, di: int, ga: int, local: int, shuffle: bool, seed: int, epoch: int
) -> None:
    step = combined_batch_size(micro, di, local, ga)
    assume(n >= step)
    kw = {"shuffle": shuffle, "seed": seed, "epoch": epoch, "rotate_leftovers": True}
    assert _invariant(n, micro, di, ga, local, 1, 0, **kw) == process_indices(n, step, 1, 0, **kw)  # type: ignore[arg-type]


def test_topology_invariant_rejects_partial_steps_without_drop_last() -> None:
    with pytest.raises(ShardingError, match=r"num_samples=10 .* 4 and drop_last=False"):
        _invariant(10, 1, 1, 1, 2, 2, 0, drop_last=False)
    assert _invariant(8, 1, 1, 1, 2, 2, 1, drop_last=False) == [2, 3, 6, 7]
    with pytest.raises(ShardingError, match=r"num_samples=3 is fewer than one global step"):
        _invariant(3, 1, 1, 1, 2, 2, 0)


# --- IterableDataset workers ---------------------------------------------------------------------


@given(instances=st.integers(1, 16), workers=st.integers(1, 16))
def test_worker_shards_are_a_bijection(instances: int, workers: int) -> None:
    shards = [
        worker_shard(i, instances, w, workers) for i in range(instances) for w in range(workers)
    ]
    assert {count for _, count in shards} == {instances * workers}
    assert sorted(index for index, _ in shards) == list(range(instances * workers))
    assert worker_shard(1, 4, 2, 3) == (2 + 3 * 1, 12)


_PINNED_10_42_0 = [4, 0, 6, 2, 1, 7, 5, 8, 9, 3]


# --- non-uniform splits ------------------------------------------------------------------------


def _per_replica_split(
    n: int, micro: int, di: int, ga: int, counts: tuple[int, ...], **kw: object
) -> dict[tuple[int, int, int, int], list[int]]:
    """As :func:`_per_replica`, for processes holding ``counts`` replicas each."""
    out: dict[tuple[int, int, int, int], list[int]] = {}
    for pid, local in enumerate(counts):
        flat = _invariant(n, micro, di, ga, local, len(counts), pid, replica_counts=counts, **kw)
        combined = micro * di * ga * local
        for s in range(len(flat) // combined):
            batch = flat[s * combined : (s + 1) * combined]
            for d in range(di):
                for a in range(ga):
                    for r in range(local):
                        start = ((d * ga + a) * local + r) * micro
                        out[(s, d, a, sum(counts[:pid]) + r)] = batch[start : start + micro]
    return out


@settings(max_examples=40)
@given(
    total=st.sampled_from([3, 5, 6, 7]),
    instances=st.integers(2, 3),
    micro=st.integers(1, 3),
    ga=st.integers(1, 2),
    extra=st.integers(0, 20),
    shuffle=st.booleans(),
    epoch=st.integers(0, 1),
)
def test_a_non_uniform_split_gives_each_replica_what_one_process_does(
    total: int, instances: int, micro: int, ga: int, extra: int, shuffle: bool, epoch: int
) -> None:
    n = 2 * micro * 2 * ga * total + extra
    counts = split_replicas(total, instances)
    kw = {"shuffle": shuffle, "seed": 3, "epoch": epoch}
    assert _per_replica_split(n, micro, 2, ga, counts, **kw) == _per_replica(
        n, micro, 2, ga, total, 1, **kw
    )


def test_split_shard_cuts_blocks_per_replica() -> None:
    # 6 replicas as (2, 2, 1, 1), 2 samples a replica's combined batch share: 100 // 12 = 8
    # whole steps of 12, so each replica reads 16 samples and 4 are left over.
    shards = [split_shard(100, 4 if pid < 2 else 2, (2, 2, 1, 1), pid) for pid in range(4)]
    assert shards == [Shard(0, 32, 4), Shard(32, 32, 4), Shard(64, 16, 4), Shard(80, 16, 4)]
    assert [
        len(b) // c
        for b, c in zip(
            [range(s.offset, s.offset + s.length) for s in shards], [4, 4, 2, 2], strict=True
        )
    ] == [8] * 4
    uneven = [split_shard(10, 2, (2, 1), pid, drop_last=False) for pid in range(2)]
    assert uneven == [Shard(0, 7, 0), Shard(7, 3, 0)]
    indices = [
        process_indices(100, 4 if p < 2 else 2, 4, p, replica_counts=(2, 2, 1, 1)) for p in range(4)
    ]
    assert sorted(i for block in indices for i in block) == list(range(96))
    with pytest.raises(ShardingError, match="not a multiple of this process's 2 replicas"):
        split_shard(100, 3, (2, 1), 0)
    with pytest.raises(ShardingError, match=r"replica_counts=\[2, 1\] does not describe"):
        _invariant(100, 1, 1, 1, 1, 2, 0, replica_counts=(2, 1))
