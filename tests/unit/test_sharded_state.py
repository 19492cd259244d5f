"""The optimizer state sharded over instances (``useReplicatedTensorSharding``): the
partition, and two instances simulated by two threads on an in-memory collective, whose
weights must equal the unsharded run's bit for bit while each keeps only its shard's state.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from torch import nn

import popdist_torch as poptorch
from popdist.collectives.base import Collectives
from popdist_torch.optim.sharded import EVERYONE, StateShards, gather_state, partition

pytestmark = pytest.mark.unit


def test_partition_balances_elements_largest_first() -> None:
    assert partition([10, 1, 1, 8, 3], 2) == [0, 0, 0, 1, 1]  # 12 and 11 elements
    assert partition([4, 4, 4, 4], 2) == [0, 1, 0, 1]
    assert partition([5], 3) == [0]
    assert partition([3, 3, 3], 1) == [0, 0, 0]
    assert partition([10, 1, 1, 8, 3], 2, min_elements=3) == [0, EVERYONE, EVERYONE, 1, EVERYONE]


class _Bus:
    """What the simulated instances share: a barrier and one slot."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=30)
        self.slot: Any = None
        self.calls = 0


class _ThreadCollectives:
    """Broadcasts between threads: the root writes the slot, the others read it."""

    def __init__(self, bus: _Bus, rank: int) -> None:
        self._bus, self._rank = bus, rank

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._bus.size

    def _share(self, value: Any, root: int) -> Any:
        if self._rank == root:
            self._bus.slot = value
            self._bus.calls += 1
        self._bus.barrier.wait()
        shared = self._bus.slot
        self._bus.barrier.wait()
        return shared

    def broadcast_(self, tensor: torch.Tensor, *, root: int = 0, name: str | None = None) -> Any:
        shared = self._share(tensor.clone(), root)
        if self._rank != root:
            tensor.copy_(shared)
        return tensor

    def broadcast_object(self, obj: Any, *, root: int = 0) -> Any:
        return copy.deepcopy(self._share(obj, root))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(6, 5)
        self.b = nn.Linear(5, 3)
        self.c = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


Factory = Callable[[nn.Module], torch.optim.Optimizer]
_SEEDING = threading.Lock()
OPTIMIZERS: dict[str, Factory] = {
    "poptorch-adamw-clipped": lambda m: poptorch.optim.AdamW(
        m.parameters(), lr=0.05, max_grad_norm=0.5, loss_scaling=4.0
    ),
    "poptorch-lamb": lambda m: poptorch.optim.LAMB(m.parameters(), lr=0.05),
    "poptorch-sgd-momentum": lambda m: poptorch.optim.SGD(
        m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01
    ),
    "torch-adam": lambda m: torch.optim.Adam(m.parameters(), lr=0.05),
}


def _train(
    optimizer_of: Factory, shards: StateShards | None, half: bool = False
) -> tuple[nn.Module, torch.optim.Optimizer]:
    with _SEEDING:  # torch's global generator is shared by the simulated instances
        model = _Net()
    if half:
        model.half()
    optimizer = optimizer_of(model)
    scale = getattr(optimizer, "loss_scaling", 1.0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(8, 6, generator=gen).to(next(model.parameters()).dtype)
        optimizer.zero_grad()
        model(x).float().pow(2).mean().mul(scale).backward()
        if scale != 1.0:
            cast(poptorch.optim.Optimizer, optimizer).unscale_next_step(scale)
        if shards is None:
            optimizer.step()
        else:
            shards.step(optimizer)
    return model, optimizer


def _instances(
    run: Callable[[StateShards], Any], size: int = 2, min_elements: int = 0
) -> list[Any]:
    bus = _Bus(size)
    results: list[Any] = [None] * size
    errors: list[BaseException] = []

    def instance(rank: int) -> None:
        try:
            collectives = cast(Collectives, _ThreadCollectives(bus, rank))
            shards = StateShards(collectives, min_elements)
            results[rank] = run(shards)
        except BaseException as error:  # reported below, on the test's thread
            errors.append(error)
            bus.barrier.abort()

    threads = [threading.Thread(target=instance, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_sharded_weights_equal_the_unsharded_ones_bit_for_bit(name: str) -> None:
    optimizer_of = OPTIMIZERS[name]
    reference, whole = _train(optimizer_of, None)
    runs = _instances(lambda shards: _train(optimizer_of, shards))
    params = list(reference.parameters())
    for model, _ in runs:
        for got, want in zip(model.parameters(), params, strict=True):
            assert torch.equal(got, want)
    held = [{i for i, p in enumerate(m.parameters()) if p in o.state} for m, o in runs]
    assert held[0] and held[1] and not held[0] & held[1]  # each keeps its shard's state only
    assert held[0] | held[1] == set(range(len(params)))
    assert len(whole.state) == len(params)


def test_tensors_at_or_below_the_minimum_are_updated_everywhere() -> None:
    optimizer_of = OPTIMIZERS["poptorch-adamw-clipped"]
    reference, _ = _train(optimizer_of, None)
    runs = _instances(lambda shards: _train(optimizer_of, shards), min_elements=5)
    sizes = [p.numel() for p in reference.parameters()]  # 30, 6 | 15, 3 | 3, 1
    held = [{i for i, p in enumerate(m.parameters()) if p in o.state} for m, o in runs]
    small = {i for i, n in enumerate(sizes) if n <= 5}
    assert held[0] & held[1] == small  # every instance keeps the small tensors' state
    assert held[0] | held[1] == set(range(len(sizes))) and held[0] != held[1]
    for model, _ in runs:
        for got, want in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(got, want)


def test_half_weights_shard_bit_for_bit() -> None:
    def optimizer_of(m: nn.Module) -> torch.optim.Optimizer:
        return poptorch.optim.Adam(m.parameters(), lr=0.01)

    reference, _ = _train(optimizer_of, None, half=True)
    for model, _ in _instances(lambda shards: _train(optimizer_of, shards, half=True)):
        for got, want in zip(model.parameters(), reference.parameters(), strict=True):
            assert got.dtype == torch.float16 and torch.equal(got, want)


def test_gather_state_gives_every_instance_the_whole_state() -> None:
    optimizer_of = OPTIMIZERS["poptorch-adamw-clipped"]
    _, whole = _train(optimizer_of, None)

    def run(shards: StateShards) -> tuple[nn.Module, torch.optim.Optimizer]:
        model, optimizer = _train(optimizer_of, shards)
        gather_state(optimizer)
        return model, optimizer

    expected = whole.state_dict()["state"]
    for _, optimizer in _instances(run):
        gathered = optimizer.state_dict()["state"]
        assert sorted(gathered) == sorted(expected)
        for index, state in expected.items():
            for key, value in state.items():
                assert torch.equal(torch.as_tensor(gathered[index][key]), torch.as_tensor(value))


def test_gather_state_leaves_an_unsharded_optimizer_alone() -> None:
    _, optimizer = _train(OPTIMIZERS["torch-adam"], None)
    before = copy.deepcopy(optimizer.state_dict())
    gather_state(optimizer)
    assert str(optimizer.state_dict()) == str(before)


def test_the_options_shard_the_optimizer_state() -> None:
    location = poptorch.TensorLocationSettings().useReplicatedTensorSharding(True)
    assert location.toDict() == {"onChip": 1, "useReplicatedTensorSharding": 1}
    opts = poptorch.Options()
    assert not opts.TensorLocations.optimizer_sharded
    opts.TensorLocations.setOptimizerLocation(location)
    assert opts.TensorLocations.optimizer_sharded and opts.TensorLocations.optimizer_on_chip
    assert "useReplicatedTensorSharding" not in poptorch.TensorLocationSettings().toDict()
    assert opts.TensorLocations.sharding_min_elements == 0
    location.minElementsForReplicatedTensorSharding(100)
    assert location.toDict()["minElementsForReplicatedTensorSharding"] == 100
    opts.TensorLocations.setOptimizerLocation(location)
    assert opts.TensorLocations.sharding_min_elements == 100
    with pytest.raises(ValueError, match=r"minElementsForReplicatedTensorSharding\(-1\)"):
        location.minElementsForReplicatedTensorSharding(-1)
