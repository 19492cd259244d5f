"""What PopTorch programs from the wild ask of the executor (issue 25): the loss wherever
the model returns it, anchored tensors, synthetic data, the executor's own methods."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import popdist_torch as poptorch
from popdist_torch.execution.runners import LocalReplicaRunner

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


# -- anchored tensors ---------------------------------------------------------------------


class Regression(nn.Module):
    """PopTorch's debugging-guide shape: two linear layers and an MSE loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(10, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(self.relu(self.fc1(x)))
        return out, nn.functional.mse_loss(out, y)


def grad_of(param: torch.Tensor) -> torch.Tensor:
    assert param.grad is not None
    return param.grad


def anchored_options(**kwargs: Any) -> poptorch.Options:
    opts = poptorch.Options().replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    opts.anchorTensor("grad_bias", "Gradient___fc2.bias", **kwargs)
    opts.anchorTensor("grad_weight", "Gradient___fc1.weight", **kwargs)
    opts.anchorTensor("update_weight", "UpdatedVar___fc2.weight", **kwargs)
    return opts


def xy(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 10, generator=gen), torch.rand(n, 10, generator=gen)


def test_anchored_gradient_is_the_gradient_the_optimizer_applied() -> None:
    model = Regression()
    reference = copy.deepcopy(model)
    trained = poptorch.trainingModel(model, anchored_options())
    x, y = xy(8, 0)
    trained(x, y)
    grad = trained.getAnchoredTensor("grad_bias")
    assert grad.shape == (10,)
    assert torch.equal(grad, grad_of(model.fc2.bias))
    assert torch.equal(trained.getAnchoredTensor("grad_weight"), grad_of(model.fc1.weight))
    assert torch.equal(trained.getAnchoredTensor("update_weight"), model.fc2.weight)
    # Mean reduction: the gradient of the mean of the 4 micro-batch losses (2 replicas x 2).
    losses = [reference(x[i : i + 2], y[i : i + 2])[1] for i in range(0, 8, 2)]
    torch.stack(losses).mean().backward()  # type: ignore[no-untyped-call]
    torch.testing.assert_close(grad, reference.fc2.bias.grad)
    trained(*xy(8, 1))
    assert not torch.equal(grad, trained.getAnchoredTensor("grad_bias"))
    assert torch.equal(trained.getAnchoredTensor("grad_bias"), grad_of(model.fc2.bias))


@pytest.mark.parametrize(
    ("mode", "period", "kept"),
    [
        (poptorch.OutputMode.All, 1, [0, 1, 2, 3]),
        (poptorch.OutputMode.EveryN, 2, [1, 3]),
        (poptorch.OutputMode.Final, 1, [3]),
        (poptorch.OutputMode.Sum, 1, None),
    ],
)
def test_anchors_follow_their_output_mode(
    mode: poptorch.OutputMode, period: int, kept: list[int] | None
) -> None:
    model = Regression()
    opts = anchored_options(output_mode=mode, output_return_period=period).deviceIterations(4)
    seen: list[torch.Tensor] = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.register_step_post_hook(lambda *_: seen.append(model.fc2.bias.grad.clone()))  # type: ignore[union-attr]
    trained = poptorch.trainingModel(model, opts, optimizer)
    trained(*xy(32, 0))
    grad = trained.getAnchoredTensor("grad_bias")
    if kept is None:
        torch.testing.assert_close(grad, torch.stack(seen).sum(dim=0))
    else:
        assert torch.equal(grad, torch.cat([seen[i] for i in kept]))


def test_a_submodule_output_is_anchored_per_micro_batch_and_replica() -> None:
    model = Regression()
    opts = anchored_options(output_mode=poptorch.OutputMode.All)
    opts.anchorTensor("hidden", "Output___fc1", poptorch.OutputMode.All)
    trained = poptorch.trainingModel(model, opts)
    x, y = xy(8, 0)
    start = copy.deepcopy(model.fc1)
    trained(x, y)
    runner = trained.replica_runner
    assert isinstance(runner, LocalReplicaRunner) and runner.fused is False  # hooks see each
    torch.testing.assert_close(trained.getAnchoredTensor("hidden"), start(x).detach())


def test_anchor_names_and_mistakes() -> None:
    model = Regression()
    trained = poptorch.trainingModel(model, poptorch.Options())
    names = trained.getTensorNames()
    for name in ("fc1.weight", "Gradient___fc2.bias", "UpdatedVar___fc2.weight", "Output___fc1"):
        assert name in names
    assert "Gradient___fc2.bias" not in poptorch.inferenceModel(Regression()).getTensorNames()
    with pytest.raises(ValueError, match="no anchors"):
        trained.getAnchoredTensor("grad")
    opts = poptorch.Options()
    opts.anchorTensor("grad", "Gradient___fc3.bias")
    with pytest.raises(ValueError, match=r"no tensor of that name; model.getTensorNames\(\)"):
        poptorch.trainingModel(Regression(), opts)
    opts = poptorch.Options()
    opts.anchorTensor("grad", "Gradient___fc2.bias")
    with pytest.raises(ValueError, match="no tensor of that name"):  # no gradient in inference
        poptorch.inferenceModel(Regression(), opts)
    opts = poptorch.Options()
    opts.anchorTensor("grad", "Gradient___fc2.bias")
    trained = poptorch.trainingModel(Regression(), opts)
    with pytest.raises(RuntimeError, match="has not run yet"):
        trained.getAnchoredTensor("grad")
    with pytest.raises(ValueError, match="no anchor of that name"):
        trained.getAnchoredTensor("other")
    with pytest.raises(ValueError, match="expected a non-empty string"):
        opts.anchorTensor("", "fc1.weight")
    assert opts.toDict()["anchored_tensors"] == {"grad": ["Gradient___fc2.bias", None, 1]}


def test_an_anchor_name_may_leave_out_or_add_a_wrapper_prefix() -> None:
    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = Regression()

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out: tuple[torch.Tensor, torch.Tensor] = self.model(x, y)
            return out

    wrapper = Wrapper()
    opts = poptorch.Options()
    opts.anchorTensor("grad", "Gradient___fc2.bias")
    opts.anchorTensor("w", "model.fc2.weight")
    trained = poptorch.trainingModel(wrapper, opts)
    trained(*xy(2, 0))
    assert torch.equal(trained.getAnchoredTensor("grad"), grad_of(wrapper.model.fc2.bias))
    opts = poptorch.Options()
    opts.anchorTensor("grad", "Gradient___model.fc2.bias")
    trained = poptorch.trainingModel(wrapper.model, opts)
    trained(*xy(2, 0))
    assert torch.equal(trained.getAnchoredTensor("grad"), grad_of(wrapper.model.fc2.bias))


def test_inference_anchors_a_parameter_and_an_output() -> None:
    model = Regression()
    opts = poptorch.Options().deviceIterations(2)
    opts.anchorTensor("w", "fc2.weight")
    opts.anchorTensor("h", "Output___relu")
    inference = poptorch.inferenceModel(model, opts)
    x, y = xy(4, 0)
    inference(x, y)
    assert torch.equal(inference.getAnchoredTensor("w"), torch.cat([model.fc2.weight] * 2))
    torch.testing.assert_close(inference.getAnchoredTensor("h"), model.relu(model.fc1(x)))


# -- the executor's own methods --------------------------------------------------------------


def test_is_compiled_after_compile_or_the_first_call() -> None:
    trained = poptorch.trainingModel(Regression(), poptorch.Options())
    assert trained.isCompiled() is False
    trained.compile(*xy(2, 0))
    assert trained.isCompiled() is True
    other = poptorch.inferenceModel(Regression())
    other(*xy(2, 0))
    assert other.isCompiled() is True
    trained.copyWeightsToHost()
    trained.copyWeightsToDevice()
    trained.detachFromDevice()
    assert not trained.isAttachedToDevice()
    trained.attachToDevice()
    trained.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        trained(*xy(2, 0))


# -- synthetic data ----------------------------------------------------------------------------


class ReadOnce(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Counts reads; a second read is an error."""

    def __init__(self) -> None:
        self.reads = 0

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        self.reads += 1
        if self.reads > 1:
            raise AssertionError(f"sample {index} read with synthetic data on")
        return torch.rand(10), 3


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 4)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc(x)
        return out, nn.functional.cross_entropy(out, labels)


def test_synthetic_data_reads_one_sample_and_reports_throughput(
    capfd: pytest.CaptureFixture[str],
) -> None:
    dataset = ReadOnce()
    opts = poptorch.Options().deviceIterations(2).enableSyntheticData(True)
    assert opts.synthetic_data and opts.toDict()["synthetic_data"] is True
    loader = poptorch.DataLoader(opts, dataset, batch_size=4, shuffle=True)
    trained = poptorch.trainingModel(Classifier(), opts)
    batches = 0
    for _ in range(2):
        for x, labels in loader:
            assert x.shape == (8, 10) and x.dtype == torch.float32
            assert labels.shape == (8,) and labels.dtype == torch.int64
            trained(x, labels)
            batches += 1
    assert dataset.reads == 1
    assert batches == 2 * len(loader) == 16
    figures = trained.throughput()
    assert figures["calls"] == 16 and figures["samples"] == 15 * 8
    assert figures["samples_per_second"] > 0
    trained.destroy()
    assert "samples/s" in capfd.readouterr().err


def test_synthetic_data_replaces_the_inputs_the_model_is_given() -> None:
    opts = poptorch.Options().enableSyntheticData(True)
    seen: list[torch.Tensor] = []
    model = Classifier()
    model.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    inference = poptorch.inferenceModel(model, opts)
    real = torch.full((4, 10), float("nan"))
    out, _ = inference(real, torch.zeros(4, dtype=torch.int64))
    inference(real, torch.zeros(4, dtype=torch.int64))
    assert torch.isfinite(out).all()
    assert torch.equal(seen[0], seen[1])  # generated once, not per call
    with pytest.raises(RuntimeError, match="enableSyntheticData"):
        poptorch.inferenceModel(Classifier()).throughput()
