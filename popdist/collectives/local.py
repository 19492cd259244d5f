"""The null backend: the collectives of a world of one process.

Rank 0 of 1: every reduction and broadcast keeps its input (the sum or mean of one value is
that value), an allgather is the one tensor (its own concatenation), a barrier returns at
once, an object broadcast returns the object. Nothing is started and no collectives library
is imported, so a one-instance run goes through the same code as a run of many (Lightning's
``SingleDeviceCollective`` is the model). The registry chooses it for the project's own
collectives over one process (:func:`popdist.collectives.for_run`); an explicit
``popdist.init()`` still starts the chosen backend, for a script's own calls to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from popdist.collectives.base import Collectives, Handle
from popdist.collectives.registry import LOCAL

__all__ = ["LocalCollectives"]


class LocalCollectives(Collectives):
    """:class:`Collectives` over this process alone: each collective returns or keeps its input."""

    name = LOCAL
    label = "the local backend"

    def start(self) -> None:
        """Nothing to join."""

    def is_started(self) -> bool:
        return True

    def shutdown(self) -> None:
        """Nothing to leave."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def allreduce_async_(
        self, tensor: torch.Tensor, *, average: bool = False, name: str | None = None
    ) -> Handle:
        return None

    def wait(self, handle: Handle) -> None:
        """Every collective here is done when it returns."""

    def allreduce_(
        self, tensor: torch.Tensor, *, average: bool = False, name: str | None = None
    ) -> torch.Tensor:
        return tensor

    def broadcast_(
        self, tensor: torch.Tensor, *, root: int = 0, name: str | None = None
    ) -> torch.Tensor:
        return tensor

    def allgather(self, tensor: torch.Tensor, *, name: str | None = None) -> torch.Tensor:
        """The one instance's ``tensor``, a copy, as a gather of several gives a new tensor."""
        return tensor.clone()

    def barrier(self) -> None:
        """Nobody to wait for."""

    def broadcast_tensors(
        self, named: Iterable[tuple[str, torch.Tensor]], *, root: int = 0
    ) -> None:
        """Every tensor already is the root's."""

    def broadcast_object(self, obj: Any, *, root: int = 0) -> Any:
        return obj

    def broadcast_optimizer_state(self, optimizer: torch.optim.Optimizer, *, root: int = 0) -> None:
        """The optimizer already is the root's."""
