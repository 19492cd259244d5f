"""trainingModel / inferenceModel in one process, against plain torch loops."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import popdist_torch as poptorch
from popdist import env

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _single_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*env.ALL, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)


class Classifier(nn.Module):
    """Returns (logits, loss) as PopTorch models do."""

    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.norm = nn.BatchNorm1d(16) if norm else nn.Identity()
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> object:
        logits = self.fc2(torch.relu(self.norm(self.fc1(x))))
        if y is None:
            return logits
        return logits, F.cross_entropy(logits, y)


def _options(di: int = 1, r: int = 1, ga: int = 1) -> poptorch.Options:
    opts = poptorch.Options().deviceIterations(di).replicationFactor(r)
    opts.Training.gradientAccumulation(ga)
    return opts


def _data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _reference(
    model: nn.Module,
    make_opt: Callable[[nn.Module], torch.optim.Optimizer],
    x: torch.Tensor,
    y: torch.Tensor,
    di: int,
    *,
    reduction: str = "mean",
    micro: int = 1,
) -> None:
    """Plain torch: one update per device iteration over its samples (mean or sum loss)."""
    opt = make_opt(model)
    per = x.shape[0] // di
    for d in range(di):
        opt.zero_grad()
        xs, ys = x[d * per : (d + 1) * per], y[d * per : (d + 1) * per]
        loss = F.cross_entropy(model(xs), ys, reduction="sum" if reduction == "sum" else "mean")
        if reduction == "sum":
            loss = loss / micro  # per-micro-batch mean losses, summed over micro-batches
        loss.backward()
        opt.step()


def _assert_same_weights(a: nn.Module, b: nn.Module, rtol: float = 1e-5) -> None:
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=rtol, atol=1e-6, msg=name)


OPTIMIZERS: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.1),
}


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize(("di", "r", "ga"), [(1, 1, 1), (3, 1, 1), (1, 4, 1), (1, 1, 2), (3, 4, 2)])
def test_training_matches_plain_torch(opt_name: str, di: int, r: int, ga: int) -> None:
    torch.manual_seed(0)
    model = Classifier()
    ref = copy.deepcopy(model)
    micro = 5
    x, y = _data(di * ga * r * micro)
    make = OPTIMIZERS[opt_name]
    wrapped = poptorch.trainingModel(model, _options(di, r, ga), make(model))
    for _ in range(2):
        wrapped(x, y)
    _reference(ref, make, torch.cat([x, x]), torch.cat([y, y]), 2 * di)
    _assert_same_weights(model, ref)


def test_sum_reduction_sums_micro_batch_losses() -> None:
    torch.manual_seed(1)
    model = Classifier()
    ref = copy.deepcopy(model)
    r, ga, micro = 2, 3, 4
    opts = _options(1, r, ga)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    x, y = _data(r * ga * micro)
    poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.05))(x, y)
    _reference(
        ref,
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05),
        x,
        y,
        1,
        reduction="sum",
        micro=micro,
    )
    _assert_same_weights(model, ref)


def _losses_per_micro_batch(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro: int
) -> torch.Tensor:
    with torch.no_grad():
        return torch.stack(
            [
                F.cross_entropy(model(x[i : i + micro]), y[i : i + micro])
                for i in range(0, len(x), micro)
            ]
        )


@pytest.mark.parametrize(
    ("mode", "period"),
    [
        (poptorch.OutputMode.Final, None),
        (poptorch.OutputMode.All, None),
        (poptorch.OutputMode.Sum, None),
        (poptorch.OutputMode.EveryN, 2),
        (poptorch.OutputMode.Default, None),
    ],
)
@pytest.mark.parametrize("r", [1, 2])  # one replica: its outputs are laid out unstacked
def test_output_modes_shapes_and_values(
    mode: poptorch.OutputMode, period: int | None, r: int
) -> None:
    """lr=0 keeps the weights fixed, so every micro-batch's loss can be recomputed."""
    torch.manual_seed(2)
    model = Classifier()
    di, ga, micro = 4, 3, 5
    opts = _options(di, r, ga).outputMode(mode, period)
    x, y = _data(di * ga * r * micro)
    logits, loss = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.0))(
        x, y
    )
    expected = _losses_per_micro_batch(model, x, y, micro)  # layout [di, ga, r]
    with torch.no_grad():
        all_logits = model(x)
    per_step = r * micro
    if loss.dim() == 0:  # one scalar kept (PopTorch returns it as a scalar)
        assert r == 1 and mode != poptorch.OutputMode.All
        loss = loss.reshape(1)
    if mode in (poptorch.OutputMode.Final, poptorch.OutputMode.Default):
        torch.testing.assert_close(loss, expected[-r:])
        torch.testing.assert_close(logits, all_logits[-per_step:])
    elif mode == poptorch.OutputMode.All:
        torch.testing.assert_close(loss, expected)
        torch.testing.assert_close(logits, all_logits)
    elif mode == poptorch.OutputMode.Sum:
        torch.testing.assert_close(loss, expected.view(-1, r).sum(0))
        torch.testing.assert_close(logits, all_logits.view(-1, per_step, 3).sum(0))
    else:
        iters = expected.view(di, ga * r)[1::2].reshape(-1)
        torch.testing.assert_close(loss, iters)
        torch.testing.assert_close(logits, all_logits.view(di, -1, 3)[1::2].reshape(-1, 3))


class ReturnsItsWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        loss = F.cross_entropy(self.lin(x), y)
        return self.lin.weight, self.lin.weight[0], x, loss


@pytest.mark.parametrize("r", [1, 2])
def test_outputs_are_the_forward_s_values_not_views_of_what_changes_later(r: int) -> None:
    """A parameter, a view of it or an input returned as an output is the value forward saw:
    the update after it, or the caller changing its input, does not change what was returned
    (one replica's outputs are returned without the copy stacking makes)."""
    torch.manual_seed(3)
    model = ReturnsItsWeight()
    before = model.lin.weight.detach().clone()
    x, y = _data(4 * r)
    x = x[:, :4].contiguous()
    weight, row, inputs, _ = poptorch.trainingModel(
        model, _options(r=r), torch.optim.SGD(model.parameters(), lr=0.5)
    )(x, y)
    assert not torch.equal(model.lin.weight, before)  # the step changed the weights
    torch.testing.assert_close(weight[: before.shape[0]], before, rtol=0, atol=0)
    torch.testing.assert_close(row[: before.shape[1]], before[0], rtol=0, atol=0)
    x.add_(1.0)
    assert not torch.equal(inputs, x)


def test_single_replica_final_loss_is_a_scalar() -> None:
    model = Classifier()
    x, y = _data(4)
    _, loss = poptorch.trainingModel(model)(x, y)
    assert loss.shape == ()
    _, losses = poptorch.trainingModel(model, _options(di=2))(*_data(4))
    assert losses.shape == ()  # Final: the last iteration's loss


def test_batchnorm_runs_replicas_in_turn_with_per_replica_statistics() -> None:
    torch.manual_seed(3)
    model = Classifier(norm=True)
    ref = copy.deepcopy(model)
    r, micro = 2, 6
    x, y = _data(r * micro)
    wrapped = poptorch.trainingModel(
        model, _options(1, r), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    _, loss = wrapped(x, y)
    assert wrapped.replica_runner.fused is False
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    losses = []
    for i in range(r):
        out = F.cross_entropy(ref(x[i * micro : (i + 1) * micro]), y[i * micro : (i + 1) * micro])
        (out / r).backward()
        losses.append(out.detach())
    opt.step()
    torch.testing.assert_close(loss, torch.stack(losses))
    _assert_same_weights(model, ref)


def test_inference_splits_over_replicas_and_shares_weights() -> None:
    torch.manual_seed(4)
    model = Classifier()
    trainer = poptorch.trainingModel(
        model, _options(1, 2), torch.optim.SGD(model.parameters(), lr=0.5)
    )
    inferer = poptorch.inferenceModel(
        model, poptorch.Options().deviceIterations(2).replicationFactor(2)
    )
    x, y = _data(8)
    before = inferer(x)
    trainer(x, y)
    after = inferer(x)
    assert after.shape == (8, 3)
    assert not torch.allclose(before, after)
    with torch.no_grad():
        torch.testing.assert_close(after, model(x))
    assert model.training  # the module's own mode is restored after a call


def test_inference_output_final_and_scalar_outputs() -> None:
    class Mean(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean()

    opts = poptorch.Options().deviceIterations(3).replicationFactor(2)
    x = torch.arange(12.0)
    torch.testing.assert_close(poptorch.inferenceModel(Mean(), opts)(x), x.view(6, 2).mean(1))
    final = poptorch.inferenceModel(Mean(), opts.clone().outputMode(poptorch.OutputMode.Final))
    torch.testing.assert_close(final(x), x.view(6, 2).mean(1)[-2:])


def test_identity_loss_and_plain_loss_output() -> None:
    class Custom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return poptorch.identity_loss((x * self.w) ** 2, reduction="sum")

    model = Custom()
    wrapped = poptorch.trainingModel(
        model, _options(r=2), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    x = torch.ones(4, 3)
    loss = wrapped(x)
    torch.testing.assert_close(loss, torch.tensor([6.0, 6.0]))
    # d/dw of mean over replicas of sum((x*w)^2) over 2 samples: 2 * 2 * w = 4
    torch.testing.assert_close(model.w.detach(), torch.full((3,), 1 - 0.1 * 4))
    with pytest.raises(poptorch.ExecutorError, match="reduction='max'"):
        poptorch.identity_loss(x, "max")


def test_errors() -> None:
    model = Classifier()
    wrapped = poptorch.trainingModel(model, _options(3, 2, 2))
    x, y = _data(10)
    with pytest.raises(poptorch.ExecutorError) as info:
        wrapped(x, y)
    assert str(info.value).startswith(
        "Invalid batch dimension: In the input argument 0, the batch dimension (10) must be a "
        "multiple of Options.deviceIterations(3) * Options.replicationFactor(2) * "
        "Options.Training.gradientAccumulation(2) = 12"
    )
    with pytest.raises(poptorch.ExecutorError, match=r"gradientAccumulation\(1\)"):
        poptorch.inferenceModel(model, _options(ga=2))
    with pytest.raises(poptorch.ExecutorError, match="scalar per micro-batch"):
        poptorch.trainingModel(nn.Linear(6, 2))(torch.ones(2, 6))
    with pytest.raises(poptorch.ExecutorError, match="scalar per micro-batch"):
        poptorch.trainingModel(nn.Linear(6, 2), _options(r=2))(torch.ones(2, 6))
    with pytest.raises(poptorch.ExecutorError, match="multiple of the period"):
        poptorch.trainingModel(model, _options(3).outputMode(poptorch.OutputMode.EveryN, 2))
    with pytest.raises(poptorch.ExecutorError, match="no tensor input"):
        poptorch.inferenceModel(model)(3)


def test_device_lifecycle_and_set_optimizer() -> None:
    torch.manual_seed(5)
    model = Classifier()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    wrapped = poptorch.trainingModel(model, optimizer=opt)
    x, y = _data(4)
    wrapped(x, y)
    wrapped.detachFromDevice()
    assert not wrapped.isAttachedToDevice()
    with pytest.raises(RuntimeError, match="not attached"):
        wrapped.detachFromDevice()
    wrapped.setOptimizer(torch.optim.SGD(model.parameters(), lr=0.2))  # new hyper-parameters
    wrapped(x, y)  # reattaches
    assert wrapped.isAttachedToDevice()
    scheduler.step()  # lr 0.2 -> 0.1, seen by the next call
    wrapped.setOptimizer(opt)
    wrapped(x, y)
    wrapped.copyWeightsToHost()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for lr in (0.1, 0.2, 0.1):
        for group in ref_opt.param_groups:
            group["lr"] = lr
        ref_opt.zero_grad()
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    _assert_same_weights(model, ref)
    assert wrapped.fc1 is model.fc1  # attributes forward to the module
    wrapped.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        wrapped(x, y)


def test_keyword_inputs_and_optimizer_in_host_memory() -> None:
    torch.manual_seed(6)
    model = Classifier()
    ref = copy.deepcopy(model)
    opts = _options(r=2)
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False)
    )
    x, y = _data(8)
    poptorch.trainingModel(model, opts, torch.optim.Adam(model.parameters(), lr=0.01))(x, y=y)
    _reference(ref, lambda m: torch.optim.Adam(m.parameters(), lr=0.01), x, y, 1)
    _assert_same_weights(model, ref)


def test_model_that_vmap_cannot_run_falls_back() -> None:
    class ItemModel(Classifier):
        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> object:
            if float(x.sum().item()) > 1e9:  # data-dependent Python control flow
                x = x * 0
            return super().forward(x, y)

    torch.manual_seed(7)
    model = ItemModel()
    ref = copy.deepcopy(model)
    x, y = _data(8)
    wrapped = poptorch.trainingModel(
        model, _options(r=4), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    wrapped(x, y)
    assert wrapped.replica_runner.fused is False
    _reference(ref, lambda m: torch.optim.SGD(m.parameters(), lr=0.1), x, y, 1)
    _assert_same_weights(model, ref)


def test_execution_strategy_runs_replicas_through_stages() -> None:
    from popdist_torch.pipeline import BeginBlock, ShardedExecution, Stage

    class TwoBlocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = BeginBlock(nn.Linear(6, 8), "B1", ipu_id=0)
            self.b = BeginBlock(nn.Linear(8, 3), "B2", ipu_id=1)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> object:
            out = self.b(torch.relu(self.a(x)))
            return out, F.cross_entropy(out, y)

    torch.manual_seed(8)
    model = TwoBlocks()
    ref = copy.deepcopy(model)
    opts = _options(di=2, r=2, ga=2)
    opts.setExecutionStrategy(ShardedExecution(Stage("B1").ipu(0), Stage("B2").ipu(1)))
    x, y = _data(16)
    out, loss = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))(
        x, y
    )
    assert out.shape == (4, 3) and loss.shape == (2,)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for d in range(2):
        opt.zero_grad()
        F.cross_entropy(
            ref(x[d * 8 : d * 8 + 8], y[d * 8 : d * 8 + 8])[0], y[d * 8 : d * 8 + 8]
        ).backward()
        opt.step()
    _assert_same_weights(model, ref)


def test_call_mode_switch_touches_only_a_module_in_the_other_mode() -> None:
    # A module already in the wrapper's mode is left exactly as the user set it (a frozen
    # BatchNorm stays in eval); a module in the other mode is switched for the call and
    # switched back afterwards.
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    model[1].eval()  # frozen statistics: running_mean must not move
    seen: list[bool] = []
    model[1].register_forward_pre_hook(lambda m, _: seen.append(m.training))

    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).pow(2).mean()

    wrapper = Loss()
    stats = model[1].running_mean.clone()
    poptorch.trainingModel(wrapper, _options(r=2))(torch.randn(8, 4))
    assert seen and not any(seen)
    torch.testing.assert_close(model[1].running_mean, stats)
    assert wrapper.training and not model[1].training

    wrapper.eval()
    seen.clear()
    poptorch.trainingModel(wrapper)(torch.randn(4, 4))
    assert seen == [True]  # switched to training for the call...
    assert not wrapper.training and not model[1].training  # ...and back


class Keyworded(nn.Module):
    """Inputs by keyword and constants among them: the executor's general (pytree) path."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Classifier()

    def forward(
        self, x: torch.Tensor, gain: float, *, bias: torch.Tensor, y: torch.Tensor | None = None
    ) -> object:
        logits = self.net(x * gain + bias)
        if y is None:
            return {"logits": logits, "top": logits.argmax(-1)}
        return logits, F.cross_entropy(logits, y)


@pytest.mark.parametrize("r", [1, 4])
def test_keyword_inputs_constants_and_dict_outputs(r: int) -> None:
    torch.manual_seed(3)
    model = Keyworded()
    ref = copy.deepcopy(model)
    di, micro = 2, 3
    x, y = _data(di * r * micro)
    bias = torch.tensor(0.25)  # 0-dim: a constant, not split over replicas
    make = OPTIMIZERS["sgd"]
    wrapped = poptorch.trainingModel(model, _options(di, r), make(model))
    logits, loss = wrapped(x, 1.5, bias=bias, y=y)
    assert logits.shape == (r * micro, 3) and loss.shape == ((r,) if r > 1 else ())
    _reference(ref.net, make, x * 1.5 + bias, y, di)
    _assert_same_weights(model, ref)

    out = poptorch.inferenceModel(model, _options(di, r))(x, 1.5, bias=bias)
    assert set(out) == {"logits", "top"}
    with torch.no_grad():
        expected = model(x, 1.5, bias=bias)
    torch.testing.assert_close(out["logits"], expected["logits"])
    assert torch.equal(out["top"], expected["top"])

    with pytest.raises(poptorch.ExecutorError, match="In the input 'y', the batch dimension"):
        wrapped(x, 1.5, bias=bias, y=y[:-1])


@pytest.mark.parametrize(("di", "r", "ga"), [(1, 4, 1), (2, 3, 2)])
def test_deterministic_reduction_matches_plain_torch(di: int, r: int, ga: int) -> None:
    torch.manual_seed(0)
    model = Classifier()
    ref = copy.deepcopy(model)
    micro = 5
    x, y = _data(di * ga * r * micro)
    opts = _options(di, r, ga)
    opts.Training.deterministicReduction()
    assert opts.Training.deterministic_reduction
    wrapped = poptorch.trainingModel(model, opts, OPTIMIZERS["adamw"](model))
    assert type(wrapped.replica_runner).__name__ == "DeterministicReplicaRunner"
    for _ in range(2):
        wrapped(x, y)
    _reference(ref, OPTIMIZERS["adamw"], torch.cat([x, x]), torch.cat([y, y]), 2 * di)
    _assert_same_weights(model, ref)


def test_deterministic_reduction_sums_replicas_in_a_fixed_order() -> None:
    """The update is the sum, replica 0 first, of each replica's own gradient (scaled by
    1 / replicas), whatever their order of arrival; Sum reduction scales by 1."""
    torch.manual_seed(3)
    model = Classifier()
    start = copy.deepcopy(model)
    x, y = _data(3 * 2)
    opts = _options(r=3)
    opts.Training.deterministicReduction()
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1.0))(x, y)
    rows = []
    for i in range(3):
        replica = copy.deepcopy(start)
        F.cross_entropy(replica(x[2 * i : 2 * i + 2]), y[2 * i : 2 * i + 2]).backward()
        rows.append([p.grad for p in replica.parameters()])
    for k, (p, q) in enumerate(zip(model.parameters(), start.parameters(), strict=True)):
        total = rows[0][k].clone()
        for row in rows[1:]:
            total = total + row[k]
        assert torch.equal(p.detach(), q.detach() - total)


def test_deterministic_reduction_refuses_a_staged_model() -> None:
    from popdist_torch.pipeline import BeginBlock, ShardedExecution, Stage

    model = nn.Sequential(BeginBlock(nn.Linear(6, 3), "B1", ipu_id=0))
    opts = _options()
    opts.setExecutionStrategy(ShardedExecution(Stage("B1").ipu(0)))
    opts.Training.deterministicReduction()
    with pytest.raises(poptorch.ExecutorError, match="deterministicReduction"):
        poptorch.trainingModel(model, opts)
    with pytest.raises(poptorch.OptionsError, match=r"deterministicReduction\('yes'\)"):
        poptorch.Options().Training.deterministicReduction("yes")  # type: ignore[arg-type]
