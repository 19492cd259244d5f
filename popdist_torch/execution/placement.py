"""Where an instance computes: its GPU when it has one, else the CPU.

poprun gives each instance its own GPUs (``CUDA_VISIBLE_DEVICES``), so an instance's
device is the current CUDA device (``cuda:0`` unless the torch backend chose another under
a plain ``mpirun``). The executor moves the model (and so the optimizer's parameters) there
once, when it wraps it; the optimizer state that already exists; every call's batch; and
hands outputs back in host memory, as PopTorch does. The local replicas run on that one
device (one ``vmap``), so they cost about one forward/backward of the combined batch.

The CPU is used when the instance has no GPU, when poprun runs ``--offline-mode``, when
the model is split into pipeline stages (the stage runner places the stages itself), or
when the gradients would cross instances over a backend that does not reduce CUDA tensors
(Horovod's build here has no GPU collectives; the torch backend's NCCL is the GPU path):
the executor asks the backend's declared capabilities (``reduces_on("cuda")``).

The decision is the pure :func:`choose_device`; tests drive it with fake device counts.

Tensors come back from a GPU without a wait each (:class:`HostCopies`): each is copied into
pinned host memory with ``non_blocking=True``, and a call waits once per device, at its end,
for its outputs and for whatever else it sent to the host (``useOnChipStorage(False)``'s
optimizer state), instead of one blocking ``.cpu()`` per tensor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

__all__ = [
    "CUDA_COPIES",
    "HostCopies",
    "choose_device",
    "instance_device",
    "move_optimizer_state",
    "optimizer_state_on_device",
    "place",
    "send_optimizer_state",
    "to_host",
]

CPU = torch.device("cpu")


def choose_device(
    *,
    device_count: int,
    current: int,
    offline: bool,
    pipelined: bool,
    collectives_on_gpu: bool = True,
) -> torch.device:
    """The device an instance computes on (pure).

    ``device_count`` GPUs visible, ``current`` the current CUDA device index,
    ``collectives_on_gpu`` whether the run's collectives (if any) take CUDA tensors.
    """
    if device_count < 1 or offline or pipelined or not collectives_on_gpu:
        return CPU
    return torch.device("cuda", current if 0 <= current < device_count else 0)


def instance_device(*, pipelined: bool, num_processes: int = 1) -> torch.device:
    """:func:`choose_device` for this process (reads CUDA, the backend, the offline flag)."""
    import popdist.collectives
    from popdist.env import read_run

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return choose_device(
        device_count=count,
        current=torch.cuda.current_device() if count else 0,
        offline=read_run().offline_mode,
        pipelined=pipelined,
        collectives_on_gpu=popdist.collectives.capabilities(num_processes).reduces_on("cuda"),
    )


class HostCopies:
    """Copies from a device to host memory that do not wait: pinned buffers, ``non_blocking``
    copies, and :meth:`wait`, once per device for every copy since the last wait.

    This is CUDA's; tests subclass it to take the path on the CPU (``is_device``).
    """

    def __init__(self) -> None:
        self.pending: set[torch.device] = set()  # devices with copies to host in flight

    def is_device(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is on a device these copies bring back."""
        return tensor.is_cuda

    def pinned_like(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(tensor, device=CPU, pin_memory=True)

    def send(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` in host memory once :meth:`wait` has returned."""
        host = self.pinned_like(tensor)
        host.copy_(tensor, non_blocking=True)
        self.pending.add(tensor.device)
        return host

    def wait(self) -> None:
        """Wait for every copy sent since the last wait (one synchronisation per device)."""
        for device in self.pending:
            self.synchronize(device)
        self.pending.clear()

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.current_stream(device).synchronize()


#: The host copies of a GPU's tensors.
CUDA_COPIES = HostCopies()


def move_optimizer_state(
    optimizer: torch.optim.Optimizer, where: Callable[[torch.Tensor], torch.device]
) -> None:
    """Move every non-scalar state tensor to ``where(param)`` (scalars stay: Adam's step)."""
    for param, state in optimizer.state.items():
        device = where(param)
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != device:
                state[key] = value.to(device, non_blocking=device != CPU)


def send_optimizer_state(optimizer: torch.optim.Optimizer, copies: HostCopies) -> None:
    """Every non-scalar state tensor on a device to host memory, through ``copies``: not
    waited for here, but with the call's outputs (the next step's copies back to the device
    are ordered after these on the device's stream)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and copies.is_device(value):
                state[key] = copies.send(value)


@contextlib.contextmanager
def optimizer_state_on_device(
    optimizer: torch.optim.Optimizer, on_chip: bool, copies: HostCopies = CUDA_COPIES
) -> Iterator[None]:
    """Around a step: the state on the parameters' device, back in host memory after it when
    ``on_chip`` is false (``useOnChipStorage(False)``: host memory between updates)."""
    if on_chip:
        yield
        return
    move_optimizer_state(optimizer, lambda p: p.device)
    try:
        yield
    finally:
        send_optimizer_state(optimizer, copies)


def place(model: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device) -> None:
    """Move ``model`` and the optimizer's state to ``device``; the optimizer follows.

    ``Module.to`` keeps each ``Parameter`` object where it can (CPU to CUDA) and swaps it
    for a new one where it cannot (some devices, or torch's swap-on-conversion mode): the
    optimizer's parameter groups and state are re-pointed at whatever the module now holds.
    """
    if device == CPU and all(p.device == CPU for p in model.parameters()):
        return
    before = list(model.parameters())
    model.to(device)
    if optimizer is None:
        return
    swapped = {
        id(old): new for old, new in zip(before, model.parameters(), strict=True) if old is not new
    }
    if swapped:
        for group in optimizer.param_groups:
            group["params"] = [swapped.get(id(p), p) for p in group["params"]]
        for old in [p for p in optimizer.state if id(p) in swapped]:
            optimizer.state[swapped[id(old)]] = optimizer.state.pop(old)
    move_optimizer_state(optimizer, lambda p: p.device)


def to_host(tree: Any, copies: HostCopies = CUDA_COPIES) -> Any:
    """``tree``'s tensors in host memory (outputs, as PopTorch returns them).

    A device's tensors through ``copies`` (pinned, not blocking), then one wait per device;
    a tensor of any other device with ``.cpu()``; a host tensor as it is.
    """

    def host(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        return copies.send(x) if copies.is_device(x) else x.cpu()

    moved = host(tree) if isinstance(tree, torch.Tensor) else tree_map(host, tree)
    copies.wait()
    return moved
