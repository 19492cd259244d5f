"""No host synchronisation per step, and one per call to bring the outputs back.

A training call must not wait for the device inside its steps: the test counts the
``aten._local_scalar_dense`` calls (what ``.item()``, ``float()`` and ``bool()`` of a tensor
run) of a training call under a ``TorchDispatchMode``, leaving out the optimizers' step
counters, which live on the CPU in torch too. The outputs' way back (pinned buffers,
``non_blocking`` copies, one wait per device) runs here through a :class:`HostCopies` that
takes the CPU for a device.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import popdist_torch as poptorch
from popdist_torch.execution.placement import (
    CPU,
    HostCopies,
    optimizer_state_on_device,
    to_host,
)

pytestmark = pytest.mark.unit


class Reads(TorchDispatchMode):
    """The tensors whose value the host read (``_local_scalar_dense``), and copies' keywords."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[torch.Tensor] = []
        self.copies: list[bool] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            self.read.append(args[0])
        if func is torch.ops.aten.copy_.default:
            self.copies.append(bool(args[2] if len(args) > 2 else kwargs.get("non_blocking")))
        return func(*args, **kwargs)


class Net(nn.Module):
    def __init__(self, reads_loss: bool = False) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 6), nn.Linear(6, 2)
        self.reads_loss = reads_loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(self.fc1(x).relu())
        loss = nn.functional.mse_loss(out, y)
        if self.reads_loss and float(loss.detach()) < 0:  # a host read in forward
            loss = loss * 2
        return out, loss


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
    "poptorch-adamw-clipped": lambda p: poptorch.optim.AdamW(
        p, lr=0.01, loss_scaling=4.0, max_grad_norm=1.0
    ),
    "poptorch-lamb": lambda p: poptorch.optim.LAMB(p, lr=0.01),
}


def host_reads(
    name: str, *, on_chip: bool = True, replicas: int = 2, model: nn.Module | None = None
) -> list[torch.Tensor]:
    """The host reads of a training call (the second: the first creates the state), the
    optimizer's step counters left out."""
    opts = poptorch.Options().replicationFactor(replicas).deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    if not on_chip:
        opts.TensorLocations.setOptimizerLocation(
            poptorch.TensorLocationSettings().useOnChipStorage(False)
        )
    net = model or Net()
    opt = OPTIMIZERS[name](net.parameters())
    wrapped = poptorch.trainingModel(net, opts, opt)
    x, y = torch.randn(8 * replicas, 4), torch.randn(8 * replicas, 2)
    wrapped(x, y)
    with Reads() as reads:
        wrapped(x, y)
    counters = {id(state["step"]) for state in opt.state.values() if "step" in state}
    return [t for t in reads.read if id(t) not in counters]


@pytest.mark.parametrize("on_chip", [True, False], ids=["on-chip", "host-memory"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_training_call_reads_nothing_back_from_its_steps(name: str, on_chip: bool) -> None:
    assert host_reads(name, on_chip=on_chip) == []


def test_the_count_sees_a_read_in_forward() -> None:
    """The control: a model that reads its loss on the host is counted, once a forward."""
    reads = host_reads("sgd", replicas=2, model=Net(reads_loss=True))
    assert len(reads) == 2 * 2 * 2  # device iterations x accumulation x replicas (in turn)


class CpuAsDevice(HostCopies):
    """The CPU taken for a device: pinned buffers are plain ones; waits are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0
        self.waits: list[torch.device] = []

    def is_device(self, tensor: torch.Tensor) -> bool:
        return tensor.device == CPU

    def pinned_like(self, tensor: torch.Tensor) -> torch.Tensor:
        self.sent += 1
        return torch.empty_like(tensor)

    def synchronize(self, device: torch.device) -> None:
        self.waits.append(device)


def test_outputs_come_back_through_non_blocking_copies_and_one_wait() -> None:
    copies = CpuAsDevice()
    out = {"logits": torch.randn(4, 3), "loss": (torch.tensor(0.5), "kept"), "n": 3}
    with Reads() as reads:
        moved = to_host(out, copies)
    assert copies.sent == 2 and copies.waits == [CPU]  # two tensors, one wait
    assert reads.copies == [True, True]  # non_blocking
    assert torch.equal(moved["logits"], out["logits"]) and moved["logits"] is not out["logits"]
    assert moved["loss"][1] == "kept" and moved["n"] == 3
    assert to_host(torch.ones(2), copies).shape == (2,) and copies.waits == [CPU, CPU]


def test_optimizer_state_in_host_memory_is_waited_for_with_the_outputs() -> None:
    """``useOnChipStorage(False)``: the state's copies to the host do not wait; the call's
    one wait for its outputs covers them."""
    copies = CpuAsDevice()
    param = nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    param.grad = torch.ones(3)
    opt.step()
    with optimizer_state_on_device(opt, on_chip=False, copies=copies):
        opt.step()
    assert copies.sent == 1 and copies.waits == []  # the momentum buffer, sent, not waited for
    to_host(torch.zeros(1), copies)
    assert copies.waits == [CPU]
    assert torch.equal(opt.state[param]["momentum_buffer"], torch.full((3,), 1.9))
