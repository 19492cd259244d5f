"""Lightning's collectives (``reduce``, ``barrier``, ``broadcast``, ``all_gather``) on PopDist.

Whatever backend the run chose (``poprun --backend horovod|torch``) carries them, through
``popdist.collectives.for_run()``; nothing here imports Horovod or torch.distributed. With a
single instance that is the local null backend: each collective gives its input back and
nothing is started.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import popdist.collectives
from popdist_lightning.errors import IPUStrategyError

__all__ = ["REDUCE_OPS", "all_gather", "barrier", "broadcast", "reduce"]

#: Lightning's names of the reductions ``reduce`` does.
REDUCE_OPS = ("avg", "max", "mean", "min", "sum")


def _collectives() -> Any:
    return popdist.collectives.for_run()


def _op_name(reduce_op: Any) -> str:
    name = str(getattr(reduce_op, "name", reduce_op) or "mean").lower()
    if name not in REDUCE_OPS:
        raise IPUStrategyError(
            f"reduce_op={reduce_op!r} is not supported by IPUStrategy: use one of "
            f"{', '.join(REDUCE_OPS)}"
        )
    return name


def reduce(tensor: Any, reduce_op: Any = "mean") -> Any:
    """``tensor`` reduced over the instances (``mean`` by default; ``sum``, ``max``, ``min``).

    A mean is a float even of integers, as Lightning's own. Anything but a tensor comes
    back as it is; the caller's tensor is left alone.
    """
    name = _op_name(reduce_op)
    if not isinstance(tensor, Tensor):
        return tensor
    c = _collectives()
    if name in ("max", "min"):
        every = c.allgather(tensor.detach().unsqueeze(0))
        return every.amax(0) if name == "max" else every.amin(0)
    total = c.allreduce_(tensor.detach().clone(), name="popdist_lightning.reduce")
    return total / c.size() if name in ("mean", "avg") else total


def barrier() -> None:
    """Return when every instance has called it."""
    _collectives().barrier()


def broadcast(obj: Any, src: int = 0) -> Any:
    """Instance ``src``'s ``obj`` on every instance."""
    return _collectives().broadcast_object(obj, root=src)


def all_gather(tensor: Tensor) -> Tensor:
    """Every instance's ``tensor``, stacked along a new leading dimension."""
    gathered: Tensor = _collectives().allgather(tensor.detach().unsqueeze(0))
    return gathered


def reduce_boolean_decision(decision: bool, all: bool = True) -> bool:
    """``decision`` of all instances (``all=True``) or of any."""
    total = int(reduce(torch.tensor(int(decision)), "sum").item())
    return total == _collectives().size() if all else total > 0
