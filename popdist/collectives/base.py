"""The collectives interface: what popdist, the executor and Lightning need from a backend.

A backend carries host-side collectives between the instances of one run. The executor
uses it for the fused, overlapped gradient allreduce (:meth:`Collectives.allreduce_async_`
then :meth:`Collectives.wait`), the wrap-time broadcast of the model and optimizer state,
and ``popdist.execute_on_instances`` (an allgather of a success flag). Every collective is
called by every instance in the same order; ``name`` identifies it where the backend
negotiates by name (Horovod) and is ignored elsewhere.

Only the implementations of this interface import a backend (Horovod, torch.distributed).
What a backend can do is declared in the registry (:attr:`Collectives.capabilities`).
"""

from __future__ import annotations

import abc
import contextlib
import io
from collections.abc import Iterable
from typing import Any

import torch

from popdist.collectives.registry import Capabilities, spec

__all__ = ["Collectives", "Handle"]

#: An in-flight asynchronous collective, opaque to the caller: give it to ``wait``.
Handle = Any

_NOTHING = contextlib.nullcontext()  # reusable: the default waited_next() block


class Collectives(abc.ABC):
    """One collective backend over the instances of the run (one object per process)."""

    #: The backend's name in :data:`~popdist.collectives.registry.REGISTRY`.
    name: str = ""
    #: How messages name it ("Horovod").
    label: str = ""

    @property
    def capabilities(self) -> Capabilities:
        """What this backend can do, as its registry entry declares."""
        return spec(self.name).capabilities

    # -- life cycle -----------------------------------------------------------------------
    @abc.abstractmethod
    def start(self) -> None:
        """Join the run's collectives (once per process; later calls do nothing).

        Raises :class:`~popdist.collectives.errors.CollectiveError` when the backend is missing.
        """

    @abc.abstractmethod
    def is_started(self) -> bool:
        """Whether :meth:`start` ran and :meth:`shutdown` did not since."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Leave the collectives (idempotent)."""

    # -- the run ----------------------------------------------------------------------------
    @abc.abstractmethod
    def rank(self) -> int:
        """This instance's index among those the backend connects."""

    @abc.abstractmethod
    def size(self) -> int:
        """How many instances the backend connects."""

    # -- collectives --------------------------------------------------------------------------
    @abc.abstractmethod
    def allreduce_async_(
        self, tensor: torch.Tensor, *, average: bool = False, name: str | None = None
    ) -> Handle:
        """Start reducing ``tensor`` in place (sum, or mean with ``average``) over all instances."""

    @abc.abstractmethod
    def wait(self, handle: Handle) -> None:
        """Block until the collective ``handle`` stands for has finished."""

    def waited_next(self) -> contextlib.AbstractContextManager[None]:
        """A hint: the collectives started in this block are waited for right after it.

        A backend with a communication thread may then leave them to the waiter instead of
        waking the thread (the torch backend's MPI lane does). The default does nothing.
        A context object, not a generator: this runs on every weight update, between the
        backward pass and the last allreduce.
        """
        return _NOTHING

    def allreduce_(
        self, tensor: torch.Tensor, *, average: bool = False, name: str | None = None
    ) -> torch.Tensor:
        """Reduce ``tensor`` in place over all instances and return it."""
        with self.waited_next():
            handle = self.allreduce_async_(tensor, average=average, name=name)
        self.wait(handle)
        return tensor

    @abc.abstractmethod
    def broadcast_(
        self, tensor: torch.Tensor, *, root: int = 0, name: str | None = None
    ) -> torch.Tensor:
        """Overwrite ``tensor`` in place with instance ``root``'s and return it."""

    @abc.abstractmethod
    def allgather(self, tensor: torch.Tensor, *, name: str | None = None) -> torch.Tensor:
        """Every instance's ``tensor`` concatenated along dimension 0, in rank order.

        Every instance passes a tensor of the same shape.
        """

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return when every instance has called it."""

    # -- composite operations (a backend may do them faster) --------------------------------
    def broadcast_tensors(
        self, named: Iterable[tuple[str, torch.Tensor]], *, root: int = 0
    ) -> None:
        """Overwrite every tensor in place with instance ``root``'s (same names everywhere)."""
        for name, tensor in named:
            self.broadcast_(tensor, root=root, name=name)

    def broadcast_object(self, obj: Any, *, root: int = 0) -> Any:
        """Instance ``root``'s ``obj`` (anything ``torch.save`` takes) on every instance."""
        if self.rank() == root:
            buffer = io.BytesIO()
            torch.save(obj, buffer)
            payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
            length = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            length = torch.zeros(1, dtype=torch.int64)
        self.broadcast_(length, root=root, name="popdist_torch.object.length")
        if self.rank() != root:
            payload = torch.empty(int(length.item()), dtype=torch.uint8)
        self.broadcast_(payload, root=root, name="popdist_torch.object")
        if self.rank() == root:
            return obj
        return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)

    def broadcast_optimizer_state(self, optimizer: torch.optim.Optimizer, *, root: int = 0) -> None:
        """Give every instance ``optimizer``'s state and hyper-parameters from ``root``."""
        state = self.broadcast_object(
            optimizer.state_dict() if self.rank() == root else None, root=root
        )
        if self.rank() != root:
            optimizer.load_state_dict(state)
