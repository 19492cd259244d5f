"""Cross-instance gradient reduction and wrap-time broadcast, on Horovod.

:class:`GradientReducer` registers one post-accumulate-grad hook per trainable
parameter.  The hooks do nothing until :meth:`GradientReducer.arm` is called just before
the last backward pass of a weight update; from then on each gradient, as soon as it is
final, goes to ``hvd.allreduce_async_`` under a stable name, so Horovod's background
thread fuses the ready tensors into few allreduces that overlap the rest of the backward
pass (Horovod's ``DistributedOptimizer`` and DDP's buckets work the same way).
:meth:`GradientReducer.finish` launches whatever did not get a gradient, waits for every
handle and leaves the reduced gradients in ``.grad``.  Intermediate accumulation steps
never communicate.

Horovod is imported only here, only when the run has more than one process.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["GradientReducer", "broadcast_state", "horovod"]


class CollectiveError(RuntimeError):
    """The collective backend disagrees with the options (process count or id)."""


def horovod(num_processes: int, process_id: int) -> Any:
    """``horovod.torch``, started by ``popdist.init()`` and checked against the options."""
    import popdist

    popdist.init()
    import horovod.torch as hvd

    if hvd.size() != num_processes or hvd.rank() != process_id:
        raise CollectiveError(
            f"Options.Distributed says process {process_id} of {num_processes} but Horovod "
            f"has rank {hvd.rank()} of {hvd.size()}: launch with poprun (or mpirun -np "
            f"{num_processes}) and leave Options.Distributed at its default"
        )
    return hvd


class GradientReducer:
    """Fused, overlapped allreduce of gradients, once per weight update."""

    def __init__(
        self, hvd: Any, named_parameters: Iterable[tuple[str, nn.Parameter]], *, average: bool
    ) -> None:
        self._hvd = hvd
        self._op = hvd.Average if average else hvd.Sum
        self._params = [(n, p) for n, p in named_parameters if p.requires_grad]
        self._armed = False
        self._handles: dict[str, Any] = {}
        self._hooks = [p.register_post_accumulate_grad_hook(self._hook(n)) for n, p in self._params]

    def _hook(self, name: str) -> Any:
        def launch(param: torch.Tensor) -> None:
            if self._armed and name not in self._handles and param.grad is not None:
                self._handles[name] = self._hvd.allreduce_async_(
                    param.grad, name=f"popdist_torch.grad.{name}", op=self._op
                )

        return launch

    def arm(self) -> None:
        """The next backward pass is the last of this update: reduce as gradients land."""
        self._armed = True
        self._handles.clear()

    def finish(self) -> None:
        """Reduce what the hooks did not (unused parameters get zeros) and wait for all."""
        self._armed = False
        for name, param in self._params:
            if name not in self._handles:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                self._handles[name] = self._hvd.allreduce_async_(
                    param.grad, name=f"popdist_torch.grad.{name}", op=self._op
                )
        for handle in self._handles.values():
            self._hvd.synchronize(handle)
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
    hvd: Any, model: nn.Module, optimizer: torch.optim.Optimizer | None, *, buffers: bool
) -> None:
    """Make every instance start from instance 0's parameters, buffers and optimizer state.

    Optimizer state is broadcast only when instance 0 has some: Horovod's helper would
    otherwise take a zero-gradient step to create it, which moves weights under weight
    decay and advances Adam's step count.
    """
    if optimizer is not None:
        has_state = torch.tensor([1 if optimizer.state else 0])
        if int(hvd.broadcast(has_state, root_rank=0, name="popdist_torch.has_state").item()):
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    tensors: dict[str, torch.Tensor] = {n: p.data for n, p in model.named_parameters()}
    if buffers:
        tensors.update({f"buffer.{n}": b for n, b in model.named_buffers()})
    hvd.broadcast_parameters(sorted(tensors.items()), root_rank=0)
