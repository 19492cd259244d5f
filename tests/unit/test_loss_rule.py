"""The loss PopTorch would take, one rule for the plain executor and the pipeline (issue 54).

Mixup as Graphcore's vision applications write it: one coefficient per micro-batch comes in
as an input, the loss is ``identity_loss(lam * l1 + (1 - lam) * l2, reduction="none")`` of
shape ``(1,)``, returned as ``(loss, accuracy)``. It trains plain (one replica, fused
replicas, replicas one by one) and pipelined (traced and staged as it runs), with the weights
of a plain torch loop on the same micro-batches.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popdist_torch as poptorch
from popdist_torch.pipeline import PipelineError
from popdist_torch.surface.loss import find_loss, loss_path, watching_losses

pytestmark = pytest.mark.unit


class Mixup(nn.Module):
    def __init__(self, *, staged: bool = False, eager: bool = False, norm: bool = False) -> None:
        super().__init__()
        # running statistics: the executor runs the replicas one by one, not fused
        self.fc1: nn.Module = (
            nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8)) if norm else nn.Linear(6, 8)
        )
        self.fc2: nn.Module = nn.Linear(8, 3)
        self.eager = eager
        if staged:
            self.fc1 = poptorch.BeginBlock(self.fc1, "first", ipu_id=0)
            self.fc2 = poptorch.BeginBlock(self.fc2, "second", ipu_id=1)

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor, lam: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc1(x))
        if self.eager and bool(h.sum() > -1e9):  # a branch on a value: torch.fx cannot trace it
            h = h * 1.0
        logits = self.fc2(h)
        l1 = F.cross_entropy(logits, labels)
        l2 = F.cross_entropy(logits, labels.flip(0))  # the permuted batch's labels
        loss = poptorch.identity_loss(lam * l1 + (1 - lam) * l2, reduction="none")
        accuracy = (logits.argmax(-1) == labels).float().mean()
        return loss, accuracy


def calls(steps: int, micro_batches: int, b: int) -> Iterator[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        n = micro_batches * b
        x = torch.randn(n, 6, generator=g)
        yield x, torch.randint(0, 3, (n,), generator=g), torch.rand(micro_batches, generator=g)


CASES: dict[str, tuple[int, int, int, bool, bool, bool | None]] = {
    # name: (device iterations, accumulation, replicas, staged, eager, norm; None: deterministic)
    "plain": (1, 4, 1, False, False, False),
    "replicas fused": (1, 2, 2, False, False, False),
    "replicas one by one": (1, 2, 2, False, False, True),
    "iterations and replicas": (2, 1, 2, False, False, False),
    "deterministic reduction": (1, 2, 2, False, False, None),
    "pipelined, traced": (1, 4, 1, True, False, False),
    "pipelined, staged as it runs": (2, 4, 1, True, True, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mixup_trains_with_the_weights_of_a_torch_loop(case: str) -> None:
    di, ga, r, staged, eager, norm = CASES[case]
    b = 2
    torch.manual_seed(1)
    model = Mixup(staged=staged, eager=eager, norm=bool(norm))
    reference = copy.deepcopy(model)
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    if norm is None:
        opts.Training.deterministicReduction(True)
    if staged:
        opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y, lam in calls(3, di * ga * r, b):
        loss, _ = training(x, y, lam)
        assert loss.shape == (r,)  # the last micro-batch's (1,) of each replica, concatenated
        per = ga * r  # micro-batches of one update, laid out [DI, GA, R, b]
        xs, ys, lams = x.view(di, per, b, 6), y.view(di, per, b), lam.view(di, per, 1)
        for d in range(di):
            sgd.zero_grad()
            for m in range(per):
                mloss, _ = reference(xs[d, m], ys[d, m], lams[d, m])
                (mloss.sum() / per).backward()  # the mean over micro-batches and replicas
            sgd.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_a_marked_loss_is_found_anywhere_whatever_its_shape() -> None:
    w = torch.ones(3, requires_grad=True)
    with watching_losses() as marks:
        loss = poptorch.identity_loss((w * 2).view(1, 3), reduction="none")
    output = {"logits": w * 3, "extra": [torch.zeros(()), {"deep": loss}]}
    assert loss_path(output, marks) == (("extra", 1, "deep"), True)
    assert find_loss(output, marks) is loss
    assert find_loss((torch.zeros(()), loss, w.sum()), marks) is loss  # not the last element
    assert find_loss(((loss, 0), (loss,)), marks) is loss  # the same tensor twice: one loss


def test_two_marked_losses_are_refused_as_poptorch_does() -> None:
    w = torch.ones(2, requires_grad=True)
    with watching_losses() as marks:
        a = poptorch.identity_loss(w.sum(), reduction="none")
        b = poptorch.identity_loss(w.mean(), reduction="mean")
    with pytest.raises(poptorch.ExecutorError, match="2 different losses marked by identity_loss"):
        find_loss((a, b), marks)


def test_marks_are_seen_only_while_watched() -> None:
    w = torch.ones(2, requires_grad=True)
    unwatched = poptorch.identity_loss(w.sum(), reduction="none")
    with watching_losses() as marks:
        pass
    assert marks == []
    assert loss_path((unwatched, w * 2), marks)[1] is False


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda w, acc: (acc, (w * 2).sum().view(1)), 1),  # an unmarked (1,) loss, last
        (lambda w, acc: ((w * 2).sum().view(1, 1), acc), 0),  # first, when the last is no loss
        (lambda w, acc: {"loss": w.sum(), "acc": acc}, "loss"),
    ],
)
def test_an_unmarked_one_element_loss(make: Any, expected: Any) -> None:
    w = torch.ones(2, requires_grad=True)
    output = make(w, torch.tensor(0.5))
    assert find_loss(output) is (output[expected])


def test_an_unmarked_loss_of_several_elements_is_refused() -> None:
    w = torch.ones(2, requires_grad=True)
    with pytest.raises(poptorch.ExecutorError, match=r"scalar per micro-batch, got shape \(2,\)"):
        find_loss((torch.tensor(0.5), w * 2))
    with pytest.raises(poptorch.ExecutorError, match="does not depend on any trainable"):
        find_loss((torch.ones(1), torch.tensor(0.5)))


def test_a_marked_loss_of_several_elements_back_propagates_their_sum() -> None:
    """``identity_loss(x, reduction="none")`` of shape (b,): every element's gradient is seeded,
    the gradient of ``x.sum()``, as PopTorch's."""

    class PerSample(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.fc(x).squeeze(-1)
            return out.detach(), poptorch.identity_loss(out**2, reduction="none")

    torch.manual_seed(0)
    model = PerSample()
    reference = copy.deepcopy(model)
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05))
    x = torch.randn(4, 3)
    _, loss = training(x)
    assert loss.shape == (4,)
    (reference.fc(x).squeeze(-1) ** 2).sum().backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.05 * p.grad  # type: ignore[operator]
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def test_a_pipelined_loss_returned_twice_is_one_loss() -> None:
    """``identity_loss(x, reduction="none")`` is ``x`` itself: returned beside ``x``, both
    places are the one loss, staged as unstaged."""

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = poptorch.BeginBlock(nn.Linear(3, 3), "a", ipu_id=0)
            self.b = poptorch.BeginBlock(nn.Linear(3, 1), "b", ipu_id=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            raw = self.b(self.a(x)).sum().view(1)
            return poptorch.identity_loss(raw, reduction="none"), raw

    torch.manual_seed(0)
    model = Twice()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    loss, raw = training(torch.randn(4, 3))
    assert loss.shape == raw.shape == (1,)


def test_a_staged_model_returning_only_logits_is_refused_as_unstaged() -> None:
    """One value returned (its logits): the loss rule applies to it too, so the traced
    pipeline refuses it, as the unstaged executor does, instead of training on its sum."""

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = poptorch.BeginBlock(nn.Linear(3, 3), "a", ipu_id=0)
            self.b = poptorch.BeginBlock(nn.Linear(3, 2), "b", ipu_id=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    with pytest.raises(poptorch.ExecutorError, match="scalar per micro-batch"):
        poptorch.trainingModel(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2)))(torch.randn(2, 3))
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    with pytest.raises(PipelineError, match="training needs the model's forward to return"):
        poptorch.trainingModel(Logits(), opts)(torch.randn(4, 3))
