"""PopTorch's replicated tensor sharding of the optimizer state, over the instances.

``opts.TensorLocations.setOptimizerLocation(TensorLocationSettings()
.useReplicatedTensorSharding(True))`` makes PopTorch split the optimizer state over the
replicas to save memory, without changing any number. Here it is done as torch's
``ZeroRedundancyOptimizer`` does it, on popdist's collectives: every parameter has one
*owner* instance (:func:`partition`: greedily, largest tensors first, to the instance with
the fewest elements so far, the same on every instance; with
``minElementsForReplicatedTensorSharding(n)``, tensors of ``n`` elements or fewer have none:
every instance updates them itself, as PopTorch leaves them unsharded); at each update every instance,
holding the same reduced gradients, runs the optimizer's step on the parameters it owns
only (the others' gradients are hidden from the update, after PopTorch's unscaling and
clipping, which read them all), so it creates and keeps optimizer state for its shard only;
then each owner broadcasts its updated parameters (one flat tensor per owner and type).
The update of a parameter is the one the unsharded step computes, and the broadcast copies
it, so the weights are those of the unsharded run bit for bit.

Checkpoints: :func:`gather_state` (called by ``save_checkpoint`` on every instance) brings
every owner's state to every instance before instance 0 writes it, so the file holds the
whole state, as an unsharded run's; the next update drops what an instance does not own.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from popdist.collectives.base import Collectives
from popdist_torch.optim.base import PopTorchOptimizer

__all__ = ["EVERYONE", "StateShards", "gather_state", "partition", "step"]

#: The shards of every sharded optimizer, for :func:`gather_state`.
_SHARDED: weakref.WeakKeyDictionary[torch.optim.Optimizer, StateShards] = (
    weakref.WeakKeyDictionary()
)


#: The owner of a tensor every instance updates itself (not sharded).
EVERYONE = -1


def partition(sizes: Sequence[int], instances: int, min_elements: int = 0) -> list[int]:
    """The owner of each tensor of ``sizes`` elements: largest first, to the least loaded.

    Tensors of ``min_elements`` elements or fewer are not sharded (owner :data:`EVERYONE`).
    """
    load = [0] * instances
    owners = [EVERYONE] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        if sizes[index] <= min_elements:
            continue
        owner = min(range(instances), key=lambda r: (load[r], r))
        owners[index] = owner
        load[owner] += sizes[index]
    return owners


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


class StateShards:
    """The optimizer-state shards of one training model, on ``collectives``."""

    def __init__(self, collectives: Collectives, min_elements: int = 0) -> None:
        self._collectives = collectives
        self._min_elements = min_elements
        self._owners: dict[tuple[int, ...], list[int]] = {}

    def owners(self, optimizer: torch.optim.Optimizer) -> list[int]:
        """The owner of each parameter of ``optimizer`` (in param-group order)."""
        params = _params(optimizer)
        key = tuple(id(p) for p in params)
        if key not in self._owners:
            sizes = [p.numel() for p in params]
            self._owners[key] = partition(sizes, self._collectives.size(), self._min_elements)
        return self._owners[key]

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Update this instance's shard, drop the others' state, share the new weights."""
        _SHARDED[optimizer] = self
        params, owners, rank = _params(optimizer), self.owners(optimizer), self._collectives.rank()
        mine = {id(p) for p, owner in zip(params, owners, strict=True) if owner in (rank, EVERYONE)}
        if isinstance(optimizer, PopTorchOptimizer):
            optimizer.step_only(mine)
        else:
            with _hidden(params, mine):
                optimizer.step()
        for p in params:
            if id(p) not in mine:
                optimizer.state.pop(p, None)
        self._share(params, owners)

    def _share(self, params: list[torch.Tensor], owners: list[int]) -> None:
        """Each owner's updated parameters to every instance: one broadcast per owner and type."""
        groups: dict[tuple[int, torch.dtype, torch.device], list[torch.Tensor]] = {}
        for p, owner in zip(params, owners, strict=True):
            if owner != EVERYONE:
                groups.setdefault((owner, p.dtype, p.device), []).append(p)
        with torch.no_grad():
            for (owner, dtype, _), members in sorted(groups.items(), key=_order):
                flat = torch.cat([p.detach().reshape(-1) for p in members])
                self._collectives.broadcast_(
                    flat, root=owner, name=f"popdist_torch.rts.{owner}.{dtype}"
                )
                if owner != self._collectives.rank():
                    offset = 0
                    for p in members:
                        p.copy_(flat[offset : offset + p.numel()].view_as(p))
                        offset += p.numel()

    def gather(self, optimizer: torch.optim.Optimizer) -> None:
        """Every owner's optimizer state on every instance (for a checkpoint)."""
        params, owners = _params(optimizer), self.owners(optimizer)
        for owner in range(self._collectives.size()):
            mine = {
                i: optimizer.state[p]
                for i, (p, o) in enumerate(zip(params, owners, strict=True))
                if o == owner and p in optimizer.state
            }
            shared = self._collectives.broadcast_object(mine, root=owner)
            for index, state in shared.items():
                optimizer.state[params[index]] = state


def _order(item: tuple[tuple[int, torch.dtype, torch.device], Any]) -> tuple[int, str, str]:
    (owner, dtype, device), _ = item
    return (owner, str(dtype), str(device))


@contextmanager
def _hidden(params: list[torch.Tensor], mine: set[int]) -> Iterator[None]:
    """The gradients of the parameters not in ``mine`` set to ``None`` (the update skips them)."""
    kept = [(p, p.grad) for p in params if id(p) not in mine and p.grad is not None]
    for p, _ in kept:
        p.grad = None
    try:
        yield
    finally:
        for p, grad in kept:
            p.grad = grad


def step(optimizer: torch.optim.Optimizer, shards: StateShards | None) -> None:
    """``optimizer.step()``, on this instance's shard when the optimizer state is sharded."""
    if shards is None:
        optimizer.step()
    else:
        shards.step(optimizer)


def gather_state(optimizer: Any) -> None:
    """Bring a sharded optimizer's whole state to every instance; others are left alone.

    Call it on every instance (``save_checkpoint`` does, before instance 0 writes).
    """
    shards = _SHARDED.get(optimizer) if isinstance(optimizer, torch.optim.Optimizer) else None
    if shards is not None:
        shards.gather(optimizer)
