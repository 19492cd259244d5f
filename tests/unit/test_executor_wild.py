"""What PopTorch programs from the wild ask of the executor (issue 25): the loss wherever
the model returns it, anchored tensors, synthetic data, the executor's own methods."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import popdist_torch as poptorch

pytestmark = pytest.mark.unit


class Ordered(nn.Module):
    """Returns ``(loss, output)`` or ``(output, loss)``; ``norm`` adds BatchNorm."""

    def __init__(self, loss_first: bool, norm: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        layers: list[nn.Module] = [nn.Linear(4, 8)]
        if norm:
            layers.append(nn.BatchNorm1d(8))
        self.net = nn.Sequential(*layers, nn.Tanh(), nn.Linear(8, 2))
        self.loss_first = loss_first

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.net(x)
        loss = poptorch.identity_loss(((out - y) ** 2).mean(), reduction="none")
        return (loss, out) if self.loss_first else (out, loss)


def options() -> poptorch.Options:
    opts = poptorch.Options().deviceIterations(2).replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    return opts.outputMode(poptorch.OutputMode.All)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(32, 4, generator=gen), torch.randn(32, 2, generator=gen)


@pytest.mark.parametrize("norm", [False, True], ids=["replicas-fused", "replicas-in-turn"])
def test_loss_first_trains_as_loss_last_bit_for_bit(norm: bool) -> None:
    results = {}
    for loss_first in (False, True):
        model = Ordered(loss_first, norm)
        opt = poptorch.optim.AdamW(model.parameters(), lr=0.01)
        trained = poptorch.trainingModel(model, options(), opt)
        outputs = [trained(*batch(seed)) for seed in range(3)]
        if loss_first:
            outputs = [(out, loss) for loss, out in outputs]
        results[loss_first] = (outputs, [p.detach().clone() for p in model.parameters()])
    (outs_last, weights_last), (outs_first, weights_first) = results[False], results[True]
    assert all(torch.equal(a, b) for a, b in zip(weights_last, weights_first, strict=True))
    for (out_a, loss_a), (out_b, loss_b) in zip(outs_last, outs_first, strict=True):
        assert torch.equal(out_a, out_b) and torch.equal(loss_a, loss_b)
    assert not torch.equal(weights_last[0], next(Ordered(False, norm).parameters()))  # trained


class LossAndMetric(nn.Module):
    """``(loss, accuracy)``: the last scalar needs no gradient, so the first is the loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.fc(x)
        accuracy = (logits.argmax(dim=1) == y).float().mean()
        return nn.functional.cross_entropy(logits, y), accuracy


def test_the_loss_is_the_scalar_that_needs_gradients() -> None:
    model = LossAndMetric()
    reference = copy.deepcopy(model)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    loss, accuracy = poptorch.trainingModel(model, poptorch.Options())(x, y)
    ref_loss = nn.functional.cross_entropy(reference.fc(x), y)
    ref_loss.backward()  # type: ignore[no-untyped-call]
    torch.testing.assert_close(loss, ref_loss.detach())
    assert 0 <= float(accuracy) <= 1
    assert reference.fc.weight.grad is not None
    with torch.no_grad():
        expected = reference.fc.weight - 0.01 * reference.fc.weight.grad  # PopTorch's SGD default
    torch.testing.assert_close(model.fc.weight, expected)


def test_a_tuple_without_a_loss_names_both_ends() -> None:
    class NoLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> tuple[Any, Any]:
            return "first", "last"

    with pytest.raises(ValueError, match="first or last element is the loss"):
        poptorch.trainingModel(NoLoss(), poptorch.Options())(torch.randn(2, 4))
