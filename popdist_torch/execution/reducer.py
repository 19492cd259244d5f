"""Cross-instance gradient reduction and wrap-time broadcast, on any :class:`Collectives`.

PopTorch's reduction semantics on top of popdist's collectives interface
(:mod:`popdist.collectives`): :func:`connect` joins the other instances through
``popdist.collectives.for_run`` (the local null backend for one process) and checks the
world against the options; the reducer and the broadcast are written against the
interface only.

:class:`GradientReducer` registers one post-accumulate-grad hook per trainable
parameter.  The hooks do nothing until :meth:`GradientReducer.arm` is called just before
the last backward pass of a weight update; from then on each gradient, as soon as it is
final, goes to the backend's ``allreduce_async_`` under a stable name, so the backend
(Horovod's background thread) fuses the ready tensors into few allreduces that overlap the
rest of the backward pass (Horovod's ``DistributedOptimizer`` and DDP's buckets work the
same way).  :meth:`GradientReducer.finish` launches whatever did not get a gradient, waits
for every handle and leaves the reduced gradients in ``.grad``.  Intermediate accumulation
steps never communicate.

Under poprun the gradients of one update go on the instance's progress record as one
:class:`popdist.progress.Group`, recorded as :meth:`finish` waits for it, through the
backend's own methods rather than its per-call wrappers: one record an update, whatever the
number of parameters, and nothing in the gradient hooks (issue 33).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

import popdist.collectives
from popdist import progress
from popdist.collectives import CollectiveError
from popdist.collectives.base import Collectives, Handle

__all__ = ["GradientReducer", "broadcast_state", "connect"]


def connect(num_processes: int, process_id: int) -> Collectives:
    """The collectives over ``num_processes`` processes, checked against the options.

    One process: the local backend. Several: the run's backend, started by ``popdist.init()``.
    """
    collectives = popdist.collectives.for_run(num_processes)
    if collectives.size() != num_processes or collectives.rank() != process_id:
        raise CollectiveError(
            f"Options.Distributed says process {process_id} of {num_processes} but the "
            f"{collectives.name} backend has rank {collectives.rank()} of {collectives.size()}: "
            f"launch with poprun (or mpirun -np {num_processes}) and leave Options.Distributed "
            f"at its default"
        )
    return collectives


class GradientReducer:
    """Fused, overlapped allreduce of gradients, once per weight update."""

    def __init__(
        self,
        collectives: Collectives,
        named_parameters: Iterable[tuple[str, nn.Parameter]],
        *,
        average: bool,
    ) -> None:
        self._collectives = collectives
        self._average = average
        self._params = [(n, p) for n, p in named_parameters if p.requires_grad]
        self._armed = False
        self._handles: dict[str, Handle] = {}
        # The backend's own methods, taken now (not looked up each call): an update's
        # gradients are recorded as one group, not by the per-call wrappers.
        self._allreduce_async_ = progress.untraced(collectives, "allreduce_async_")
        self._wait = progress.untraced(collectives, "wait")
        self._group = progress.Group(
            "allreduce", [f"popdist_torch.grad.{n}" for n, _ in self._params],
            [p for _, p in self._params],
        )  # fmt: skip
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._hook(n))  # type: ignore[no-untyped-call]
            for n, p in self._params
        ]

    @property
    def collectives(self) -> Collectives:
        """The collectives the gradients are reduced on."""
        return self._collectives

    def _launch(self, name: str, grad: torch.Tensor) -> None:
        try:
            self._handles[name] = self._allreduce_async_(
                grad, average=self._average, name=f"popdist_torch.grad.{name}"
            )
        except BaseException as error:
            progress.group_failed(self._group, error)
            raise

    def _hook(self, name: str) -> Callable[[torch.Tensor], None]:
        def launch(param: torch.Tensor) -> None:
            if self._armed and name not in self._handles and param.grad is not None:
                self._launch(name, param.grad)

        return launch

    def arm(self) -> None:
        """The next backward pass is the last of this update: reduce as gradients land."""
        self._armed = True
        self._handles.clear()

    def disarm(self) -> None:
        """Forget an armed backward pass that failed before its gradients were final.

        The executor calls it when a fused attempt fails and the step is run again.
        """
        self._armed = False
        self._handles.clear()

    def finish(self) -> None:
        """Reduce what the hooks did not (unused parameters get zeros) and wait for all."""
        self._armed = False
        with self._collectives.waited_next():
            for name, param in self._params:
                if name not in self._handles:
                    if param.grad is None:
                        param.grad = torch.zeros_like(param)
                    self._launch(name, param.grad)
        progress.wait_group(self._group, self._wait, self._handles.values())
        self._handles.clear()

    def reduce_all(self) -> None:
        """Reduce every gradient now (for runners that do not fire the hooks in order)."""
        self._handles.clear()
        self.finish()

    def remove(self) -> None:
        """Unregister the hooks."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def broadcast_state(
    collectives: Collectives,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    buffers: bool,
) -> None:
    """Make every instance start from instance 0's parameters, buffers and optimizer state.

    Optimizer state is broadcast only when instance 0 has some: Horovod's helper would
    otherwise take a zero-gradient step to create it, which moves weights under weight
    decay and advances Adam's step count.
    """
    if optimizer is not None:
        has_state = torch.tensor([1 if optimizer.state else 0])
        collectives.broadcast_(has_state, root=0, name="popdist_torch.has_state")
        if int(has_state.item()):
            collectives.broadcast_optimizer_state(optimizer, root=0)
    tensors: dict[str, torch.Tensor] = {n: p.data for n, p in model.named_parameters()}
    if buffers:
        tensors.update({f"buffer.{n}": b for n, b in model.named_buffers()})
    collectives.broadcast_tensors(sorted(tensors.items()), root=0)
