"""The PopTorch names real applications use (issue 30 part B): ``variable_attrs``, ``None``
hyper-parameters, ``poptorch.optim.Optimizer``, ``copy.deepcopy`` of frozen options, options
the mode ignores, ``getLatency()``.
"""

from __future__ import annotations

import copy
import logging
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import data as tud

import popdist_torch as poptorch
from popdist_torch.data import DataLoader
from popdist_torch.enums import DataLoaderMode
from popdist_torch.errors import OptimizerError
from popdist_torch.execution import observation
from tests.support.data import make_options

pytestmark = pytest.mark.unit

OPTIMIZERS = (
    poptorch.optim.SGD,
    poptorch.optim.Adam,
    poptorch.optim.AdamW,
    poptorch.optim.RMSprop,
    poptorch.optim.LAMB,
)

#: Torch's defaults (LAMB: PopTorch's), which ``None`` stands for.
DEFAULTS: dict[type, dict[str, Any]] = {
    poptorch.optim.SGD: {"lr": 1e-3, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0},
    poptorch.optim.Adam: {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    poptorch.optim.AdamW: {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2},
    poptorch.optim.RMSprop: {"lr": 1e-2, "alpha": 0.99, "eps": 1e-8, "momentum": 0.0},
    poptorch.optim.LAMB: {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2},
}


def _params() -> list[nn.Parameter]:
    torch.manual_seed(0)
    return list(nn.Linear(3, 2).parameters())


class LossModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).pow(2).mean()


# -- poptorch.optim.Optimizer and None hyper-parameters ----------------------------------


@pytest.mark.parametrize("cls", OPTIMIZERS, ids=lambda c: c.__name__)
def test_every_optimizer_is_a_poptorch_optim_optimizer(cls: type) -> None:
    assert isinstance(cls(_params()), poptorch.optim.Optimizer)
    assert not isinstance(torch.optim.SGD(_params(), lr=0.1), poptorch.optim.Optimizer)


@pytest.mark.parametrize("cls", OPTIMIZERS, ids=lambda c: c.__name__)
def test_none_hyper_parameters_take_the_defaults(cls: type) -> None:
    names = {name: None for name in DEFAULTS[cls]}
    extra = {"foreach": None, "maximize": None} if cls is not poptorch.optim.LAMB else {}
    optimizer = cls(_params(), **names, **extra, loss_scaling=None, accum_type=None)
    group = optimizer.param_groups[0]
    assert {name: group[name] for name in DEFAULTS[cls]} == DEFAULTS[cls]
    assert optimizer.loss_scaling == 1.0 and optimizer.accum_type == torch.float32


def test_adam_with_none_betas_and_eps_trains_as_torchs_default_adam() -> None:
    a, b = nn.Linear(4, 2), nn.Linear(4, 2)
    b.load_state_dict(a.state_dict())
    ours = poptorch.optim.Adam(a.parameters(), lr=0.1, betas=None, eps=None)
    theirs = torch.optim.Adam(b.parameters(), lr=0.1)
    x = torch.arange(8.0).reshape(2, 4)
    for net, optimizer in ((a, ours), (b, theirs)):
        for _ in range(3):
            optimizer.zero_grad()
            net(x).pow(2).mean().backward()
            optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


# -- variable_attrs ----------------------------------------------------------------------


@pytest.mark.parametrize("cls", OPTIMIZERS, ids=lambda c: c.__name__)
def test_passed_attributes_are_variable_the_others_constant(cls: type) -> None:
    optimizer = cls(_params(), lr=0.5, weight_decay=0.0)
    attrs = optimizer.variable_attrs
    assert isinstance(attrs, poptorch.optim.VariableAttributes)
    assert not attrs.isConstant("lr") and not attrs.isConstant("weight_decay")
    assert attrs.isConstant("eps" if cls is not poptorch.optim.SGD else "momentum")
    assert attrs.isConstant("loss_scaling")
    assert not cls(_params(), lr=0.5, loss_scaling=2.0).variable_attrs.isConstant("loss_scaling")
    assert cls(_params()).variable_attrs.isConstant("lr")  # not passed: constant, as PopTorch


def test_mark_as_constant_and_variable() -> None:
    attrs = poptorch.optim.SGD(_params(), lr=0.01, momentum=0.9).variable_attrs
    attrs.markAsConstant("momentum")
    assert attrs.isConstant("momentum")
    attrs.markAsVariable("weight_decay")
    attrs.markAsVariable("weight_decay")
    assert not attrs.isConstant("weight_decay")
    attrs.markAsConstant("weight_decay")
    assert attrs.isConstant("weight_decay")
    with pytest.raises(OptimizerError, match=r"unknown attribute 'wd'.*'weight_decay'"):
        attrs.markAsConstant("wd")
    with pytest.raises(ValueError, match="unknown attribute"):
        attrs.markAsVariable("wd")


def test_variable_attrs_survive_deepcopy_and_pickle() -> None:
    optimizer = poptorch.optim.AdamW(_params(), lr=0.1, max_grad_norm=1.0)
    optimizer.variable_attrs.markAsVariable("eps")
    for copied in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        assert not copied.variable_attrs.isConstant("eps")
        assert copied.variable_attrs.isConstant("betas")
        assert copied.max_grad_norm == 1.0  # PopTorch's other attributes too


def _training(
    optimizer_of: Callable[[nn.Module], torch.optim.Optimizer],
) -> tuple[nn.Module, Any, torch.optim.Optimizer]:
    model = LossModel()
    optimizer = optimizer_of(model)
    return model, poptorch.trainingModel(model, poptorch.Options(), optimizer), optimizer


X = torch.arange(8.0).reshape(2, 4) / 8


def test_changing_a_constant_after_the_first_run_is_refused_before_the_call_runs() -> None:
    model, executor, optimizer = _training(
        lambda m: poptorch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5)
    )
    optimizer.param_groups[0]["weight_decay"] = 0.5  # before the first run: still free
    executor(X)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer.param_groups[0]["weight_decay"] = 0.1
    with pytest.raises(OptimizerError) as caught:
        executor(X)
    message = str(caught.value)
    assert "SGD.weight_decay (param group 0) changed from 0.5 to 0.1" in message
    assert "markAsVariable('weight_decay')" in message and "\n" not in message
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def test_variable_attributes_change_freely_between_calls() -> None:
    _, executor, optimizer = _training(
        lambda m: poptorch.optim.Adam(m.parameters(), lr=0.1, weight_decay=0.0)
    )
    optimizer.variable_attrs.markAsVariable("eps")
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(3):
        executor(X)
        scheduler.step()
        optimizer.param_groups[0]["weight_decay"] += 0.01
        optimizer.param_groups[0]["eps"] *= 2
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0125)


def test_set_optimizer_with_a_different_constant_is_refused() -> None:
    _, executor, _ = _training(lambda m: poptorch.optim.Adam(m.parameters(), lr=0.1))
    executor(X)
    model = executor.model
    executor.setOptimizer(poptorch.optim.Adam(model.parameters(), lr=0.05))  # lr is variable
    executor(X)
    executor.setOptimizer(poptorch.optim.Adam(model.parameters(), lr=0.05, eps=1e-3))
    with pytest.raises(OptimizerError, match=r"Adam\.eps .* changed from 1e-08 to 0\.001"):
        executor(X)


def test_torch_optimizers_have_no_constants() -> None:
    _, executor, optimizer = _training(lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    executor(X)
    optimizer.param_groups[0]["momentum"] = 0.9
    executor(X)


# -- Options: deepcopy, ignored DataLoader arguments ----------------------------------------


def test_deepcopy_of_options_a_dataloader_froze_is_an_unfrozen_copy() -> None:
    opts = poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    DataLoader(opts, tud.TensorDataset(torch.arange(16.0)), batch_size=2)
    assert opts.is_frozen
    copied = copy.deepcopy(opts)
    assert not copied.is_frozen
    copied.deviceIterations(4).Training.gradientAccumulation(3)
    assert (copied.device_iterations, copied.Training.gradient_accumulation) == (4, 3)
    assert (opts.device_iterations, opts.Training.gradient_accumulation) == (2, 2)
    assert opts.is_frozen and opts.clone().toDict() == opts.toDict()


@pytest.mark.parametrize("mode", [DataLoaderMode.Sync, DataLoaderMode.Async])
def test_rebatched_worker_size_outside_async_rebatched_is_ignored_with_a_note(
    mode: DataLoaderMode, caplog: pytest.LogCaptureFixture
) -> None:
    data = tud.TensorDataset(torch.arange(32.0))
    with caplog.at_level(logging.INFO, logger="popdist_torch"):
        loader = DataLoader(make_options(), data, batch_size=4, mode=mode, rebatched_worker_size=2)
    notes = [r.getMessage() for r in caplog.records if "rebatched_worker_size" in r.getMessage()]
    assert len(notes) == 1 and "ignored" in notes[0] and notes[0].count("\n") == 0
    assert all(r.levelno == logging.INFO for r in caplog.records)
    plain = DataLoader(make_options(), data, batch_size=4)
    assert [b[0].tolist() for b in loader] == [b[0].tolist() for b in plain]
    if mode == DataLoaderMode.Async:
        loader.terminate()


def test_async_options_in_sync_mode_are_ignored_with_a_note(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = tud.TensorDataset(torch.arange(16.0))
    with caplog.at_level(logging.INFO, logger="popdist_torch"):
        loader = DataLoader(make_options(), data, batch_size=4, async_options={"bufer_size": 2})
    assert any("async_options" in r.getMessage() for r in caplog.records)
    assert len(list(loader)) == 4


def test_an_output_return_period_outside_every_n_is_ignored_with_a_note(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="popdist_torch"):
        opts = poptorch.Options().outputMode(poptorch.OutputMode.All, 3)
    assert (opts.output_mode, opts.output_return_period) == (poptorch.OutputMode.All, 1)
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "ignored" in notes[0] and "EveryN" in notes[0]
    executor = poptorch.inferenceModel(nn.Linear(4, 2), opts.deviceIterations(2))
    assert executor(torch.ones(2, 4)).shape == (2, 2)  # All: every iteration's outputs


def test_rebatched_worker_size_is_still_checked_where_it_applies() -> None:
    with pytest.raises(ValueError, match="rebatched_worker_size=3 is invalid"):
        DataLoader(
            make_options(),
            tud.TensorDataset(torch.arange(16.0)),
            batch_size=4,
            mode=DataLoaderMode.AsyncRebatched,
            rebatched_worker_size=3,
        )


# -- getLatency --------------------------------------------------------------------------


class _Clock:
    """A fake ``time`` for the executor's latency clock: the model's forward advances it."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class _Costly(nn.Module):
    """Each forward takes the next of ``costs`` seconds on the fake clock."""

    def __init__(self, clock: _Clock, costs: list[float]) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.clock, self.costs = clock, costs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.now += self.costs.pop(0)
        return self.linear(x).pow(2).mean()


@pytest.mark.parametrize("training", [False, True], ids=["inference", "training"])
def test_get_latency_is_min_max_mean_of_the_last_calls_iterations(
    training: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr(observation, "time", clock)
    model = _Costly(clock, [1.0, 4.0, 2.5, 0.5, 0.5, 0.5])
    opts = poptorch.Options().deviceIterations(3)
    wrap = poptorch.trainingModel if training else poptorch.inferenceModel
    executor = wrap(model, opts)
    assert executor.getLatency() == (0.0, 0.0, 0.0)
    x = torch.ones(3, 4)
    executor(x)
    assert executor.getLatency() == (1.0, 4.0, 2.5)
    executor(x)  # the last call's figures replace the earlier ones
    assert executor.getLatency() == (0.5, 0.5, 0.5)


def test_get_latency_measures_real_host_time() -> None:
    executor = poptorch.inferenceModel(nn.Linear(4, 2), poptorch.Options().deviceIterations(2))
    executor(torch.ones(2, 4))
    low, high, mean = executor.getLatency()
    assert 0.0 < low <= mean <= high < 60.0
