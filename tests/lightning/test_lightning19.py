"""Lightning 1.9 IPU programs on Lightning 2 (issue 25): what they pass and define keeps its
meaning (autoreport, replicas from the options, their own poptorch.DataLoader with
accumulation), and what Lightning 2 removed is one error line naming the replacement.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

import popdist_lightning
import popdist_torch as poptorch
from popdist_lightning import IPUStrategy, IPUStrategyError
from popdist_lightning.strategy.loaders import adopt_poptorch_loader
from tests.lightning.cases import (
    QUIET,
    SAMPLES,
    Classifier,
    cpu_reference,
    dataset,
    max_difference,
)

pytestmark = pytest.mark.filterwarnings("ignore")
MICRO = 2


def _trainer(strategy: IPUStrategy, **kwargs: Any) -> pl.Trainer:
    kwargs.setdefault("enable_checkpointing", False)
    return pl.Trainer(accelerator="ipu", strategy=strategy, **QUIET, **kwargs)


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


# -- autoreport -------------------------------------------------------------------------


def test_autoreport_writes_each_graphs_schedule_profile(tmp_path: Path) -> None:
    directory = tmp_path / "reports" / "run"
    strategy = IPUStrategy(
        device_iterations=2,
        autoreport=True,
        autoreport_dir=str(directory),
        autoreport_options={"autoReport.all": "true", "autoReport.executionProfileProgramRuns": 2},
    )
    assert directory.is_dir()  # created by the strategy, as Lightning 1.9 did
    trainer = _trainer(strategy, devices=2, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(Classifier(MICRO))
    assert sorted(p.name for p in directory.iterdir()) == ["training", "validation"]

    profile = _json(directory / "training" / "profile.json")
    assert profile["calls"] == trainer.global_step == SAMPLES // (MICRO * 2 * 2)
    assert (profile["replicas"], profile["device_iterations"]) == (2, 2)
    assert profile["gradient_accumulation"] == 1
    assert profile["autoreport_options"] == {
        "autoReport.all": "true",
        "autoReport.executionProfileProgramRuns": 2,
    }
    assert 0 < profile["call_seconds"]["min"] <= profile["call_seconds"]["max"]
    assert profile["call_seconds"]["total"] >= profile["first_call_seconds"]
    assert profile["stages"] == []  # one stage: no stage rows

    trace = _json(directory / "training" / "schedule.json")["traceEvents"]
    calls = [e for e in trace if e.get("cat") == "executor call"]
    assert len(calls) == trainer.global_step
    starts = [e["ts"] for e in calls]
    assert starts == sorted(starts) and all(e["dur"] > 0 for e in calls)
    validation = _json(directory / "validation" / "profile.json")
    assert validation["calls"] == SAMPLES // (MICRO * 2 * 2) and validation["step"] == (
        "validation_step"
    )


def test_autoreport_of_a_staged_module_shows_every_stage(tmp_path: Path) -> None:
    model = Classifier(MICRO)
    model.net[0] = poptorch.BeginBlock(model.net[0], ipu_id=0)
    model.net[2] = poptorch.BeginBlock(model.net[2], ipu_id=1)
    strategy = IPUStrategy(autoreport=True)  # the directory defaults under default_root_dir
    trainer = _trainer(
        strategy,
        devices=1,
        max_steps=3,
        accumulate_grad_batches=4,
        limit_val_batches=0,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(model)
    folder = tmp_path / "autoreport" / "training"
    profile = _json(folder / "profile.json")
    assert profile["calls"] == 3
    assert profile["execution_strategy"] == "PipelinedExecution"
    # 3 calls x 4 micro-batches: each stage ran 12 forwards and 12 backwards
    assert [(s["stage"], s["forward"], s["backward"]) for s in profile["stages"]] == [
        (0, 12, 12),
        (1, 12, 12),
    ]
    trace = _json(folder / "schedule.json")["traceEvents"]
    ops = {(e["tid"], e["cat"]) for e in trace if e.get("cat") in ("forward", "backward")}
    assert ops == {(0, "forward"), (0, "backward"), (1, "forward"), (1, "backward")}


def test_autoreport_arguments_are_checked() -> None:
    with pytest.raises(IPUStrategyError, match="autoreport='yes'"):
        IPUStrategy(autoreport="yes")  # type: ignore[arg-type]
    with pytest.raises(IPUStrategyError, match="autoreport_options"):
        IPUStrategy(autoreport=True, autoreport_options=["autoReport.all"])  # type: ignore[arg-type]


# -- replicas from the options ----------------------------------------------------------


@pytest.mark.parametrize("devices", [1, None])
def test_replicas_come_from_the_options_replication_factor(devices: int | None) -> None:
    opts = poptorch.Options().replicationFactor(2)
    kwargs = {} if devices is None else {"devices": devices}
    trainer = _trainer(IPUStrategy(training_opts=opts), max_epochs=1, **kwargs)
    assert trainer.num_devices == 2
    model = Classifier(MICRO)
    trainer.fit(model)
    assert trainer.global_step == SAMPLES // (MICRO * 2)
    assert max_difference(model, cpu_reference(2, MICRO, 1, epochs=1)) < 1e-6


def test_devices_beside_another_replication_factor_is_one_error_naming_both() -> None:
    opts = poptorch.Options().replicationFactor(4)
    with pytest.raises(IPUStrategyError) as info:
        _trainer(IPUStrategy(training_opts=opts), devices=2)
    message = str(info.value)
    assert "replicationFactor(4)" in message and "devices=2" in message
    assert "\n" not in message
    inference = poptorch.Options().replicationFactor(2)
    with pytest.raises(IPUStrategyError) as info:
        _trainer(IPUStrategy(training_opts=opts, inference_opts=inference)).fit(Classifier(MICRO))
    message = str(info.value)
    assert "inference_opts.replicationFactor(2)" in message
    assert "training_opts.replicationFactor(4)" in message


# -- the user's own poptorch.DataLoader with accumulate_grad_batches ----------------------


@pytest.mark.parametrize(("devices", "device_iterations", "accumulation"), [(1, 1, 2), (2, 2, 3)])
def test_the_users_poptorch_loader_trains_with_accumulate_grad_batches(
    devices: int, device_iterations: int, accumulation: int
) -> None:
    opts = poptorch.Options().deviceIterations(device_iterations)
    sizes: list[int] = []

    class OwnLoader(Classifier):
        def train_dataloader(self) -> Any:
            return poptorch.DataLoader(opts, dataset(), batch_size=MICRO)

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            sizes.append(len(batch[0]))

    model = OwnLoader(MICRO)
    trainer = _trainer(
        IPUStrategy(training_opts=opts),
        devices=devices,
        max_epochs=1,
        accumulate_grad_batches=accumulation,
        limit_val_batches=0,
    )
    trainer.fit(model)
    combined = MICRO * devices * device_iterations * accumulation
    assert set(sizes) == {combined}  # the loader combines per the completed options
    assert trainer.global_step == SAMPLES // combined
    reference = cpu_reference(devices, MICRO, accumulation, epochs=1, limit_val_batches=0)
    assert max_difference(model, reference) < 1e-6


def test_a_poptorch_loader_from_other_options_is_still_refused() -> None:
    other = poptorch.Options().deviceIterations(3)

    class OtherLoader(Classifier):
        def train_dataloader(self) -> Any:
            return poptorch.DataLoader(other, dataset(), batch_size=MICRO)

    with pytest.raises(IPUStrategyError, match=r"\(3, 1, 1\) feeds a model run with \(2, 1, 1\)"):
        _trainer(IPUStrategy(device_iterations=2), devices=1, max_epochs=1).fit(OtherLoader(MICRO))


# -- what Lightning 2 removed -----------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "replacement"),
    [
        ({"ipus": 4}, "Trainer(accelerator='ipu', devices=4)"),
        ({"progress_bar_refresh_rate": 10}, "callbacks=[TQDMProgressBar(refresh_rate=10)]"),
        ({"resume_from_checkpoint": "last.ckpt"}, "trainer.fit(model, ckpt_path='last.ckpt')"),
    ],
)
def test_lightning1_trainer_arguments_name_their_replacement(
    argument: dict[str, Any], replacement: str
) -> None:
    with pytest.raises(IPUStrategyError) as info:
        popdist_lightning.Trainer(max_epochs=1, **argument)
    message = str(info.value)
    assert replacement in message and next(iter(argument)) in message and "\n" not in message


def test_the_trainer_is_lightnings_otherwise() -> None:
    trainer = popdist_lightning.Trainer(accelerator="ipu", devices=2, max_epochs=1, **QUIET)
    assert isinstance(trainer, pl.Trainer) and isinstance(trainer.strategy, IPUStrategy)
    with pytest.raises(TypeError, match="ipus"):  # Lightning's own Trainer is not patched
        pl.Trainer(ipus=4)  # type: ignore[call-arg]


class _StepEnd(Classifier):
    def training_step_end(self, outputs: Any) -> Any:  # silently skipped by Lightning 2 alone
        return outputs


class _OnEpochEnd(pl.Callback):
    def on_epoch_end(self, trainer: Any, module: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("module", "run", "callbacks", "hook", "replacement"),
    [
        (_StepEnd, "fit", [], "training_step_end", "training_step"),
        (Classifier, "fit", [_OnEpochEnd()], "_OnEpochEnd.on_epoch_end", "on_train_epoch_end"),
    ],
)
def test_lightning1_hooks_name_their_replacement(
    module: type[Classifier], run: str, callbacks: list[Any], hook: str, replacement: str
) -> None:
    trainer = _trainer(IPUStrategy(), devices=1, max_epochs=1, callbacks=callbacks)
    with pytest.raises(IPUStrategyError) as info:
        getattr(trainer, run)(module(MICRO))
    message = str(info.value)
    assert hook in message and f"use {replacement}" in message and "\n" not in message
    assert trainer.global_step == 0  # refused before anything ran


def test_no_removed_name_is_defined_by_lightning_itself() -> None:
    """The hook check would refuse every module if Lightning 2 defined one of the names."""
    from lightning.pytorch import callbacks

    from popdist_lightning.epoch_outputs import EPOCH_END_HOOKS
    from popdist_lightning.legacy import REMOVED_HOOKS, REMOVED_TRAINER_ARGUMENTS

    owners = [pl.LightningModule, pl.Callback, *vars(callbacks).values()]
    hooks = [*REMOVED_HOOKS, *EPOCH_END_HOOKS]
    assert not [(o, h) for o in owners for h in hooks if hasattr(o, h)]
    accepted = set(inspect.signature(pl.Trainer.__init__).parameters)
    assert not set(REMOVED_TRAINER_ARGUMENTS) & accepted


class _EpochEnds(Classifier):
    """A Lightning 1.9 module: its epoch-end hooks take the step outputs."""

    def __init__(self, batch_size: int, validation_loaders: int = 1) -> None:
        super().__init__(batch_size)
        self.validation_loaders = validation_loaders
        self.calls: list[tuple[str, Any]] = []
        self.step_losses: list[torch.Tensor] = []

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        x, y = batch
        correct = (self(x).argmax(-1) == y).sum()
        return {"correct": correct, "loader": torch.full_like(correct, dataloader_idx)}

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        # None is left out of the outputs, as Lightning 1.9 did
        return torch.tensor(float(batch_idx)) if batch_idx % 2 else None

    def val_dataloader(self) -> Any:
        loaders = [self._loader() for _ in range(self.validation_loaders)]
        return loaders[0] if self.validation_loaders == 1 else loaders

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.step_losses.append(outputs["loss"])

    def training_epoch_end(self, outputs: Any) -> None:
        self.calls.append(("training_epoch_end", outputs))

    def on_train_epoch_end(self) -> None:
        self.calls.append(("on_train_epoch_end", None))

    def validation_epoch_end(self, outputs: Any) -> None:
        self.calls.append(("validation_epoch_end", outputs))
        self.log("val_correct", float(sum(int(o["correct"].sum()) for o in _flat(outputs))))

    def test_epoch_end(self, outputs: Any) -> None:
        self.calls.append(("test_epoch_end", outputs))


def _flat(outputs: list[Any]) -> list[Any]:
    return [o for item in outputs for o in (item if isinstance(item, list) else [item])]


def test_lightning1_epoch_end_hooks_get_the_step_outputs() -> None:
    module = _EpochEnds(MICRO)
    trainer = _trainer(
        IPUStrategy(),
        devices=2,
        max_epochs=2,
        num_sanity_val_steps=0,
        limit_train_batches=3,
        limit_val_batches=2,
    )
    with pytest.warns(UserWarning, match=r"training_epoch_end\(outputs\) is a Lightning 1.x hook"):
        trainer.fit(module)
    names = [name for name, _ in module.calls]
    epoch = ["validation_epoch_end", "training_epoch_end", "on_train_epoch_end"]
    assert names == epoch * 2  # each epoch: validation inside it, then 1.9's order
    first, second = module.calls[1][1], module.calls[4][1]
    assert len(first) == len(second) == 3 and trainer.global_step == 6
    assert [o["loss"] for o in first + second] == module.step_losses  # each step's own loss
    assert all(set(o) == {"loss"} and not o["loss"].requires_grad for o in first)
    validation = module.calls[0][1]
    assert len(validation) == 2 and {i for o in validation for i in o["loader"].tolist()} == {0}
    correct = sum(int(o["correct"].sum()) for o in module.calls[3][1])
    assert trainer.callback_metrics["val_correct"] == correct  # self.log works in the hook


def test_lightning1_epoch_end_hooks_with_two_loaders_and_none_outputs() -> None:
    module = _EpochEnds(MICRO, validation_loaders=2)
    trainer = _trainer(IPUStrategy(), devices=2, limit_val_batches=3, limit_test_batches=6)
    trainer.validate(module)
    trainer.test(module)
    (_, validation), (_, test) = module.calls
    steps = 3
    assert [len(outputs) for outputs in validation] == [steps, steps]
    loaders = [{i for o in outputs for i in o["loader"].tolist()} for outputs in validation]
    assert loaders == [{0}, {1}]
    assert [float(o.flatten()[0]) for o in test] == [1.0, 3.0, 5.0]


class _PredictResults(Classifier):
    def on_predict_epoch_end(self, results: Any) -> None:  # Lightning 1.9's form
        self.results = results


def test_lightning1_on_predict_epoch_end_gets_the_predictions() -> None:
    module = _PredictResults(MICRO)
    trainer = _trainer(IPUStrategy(), devices=2, limit_predict_batches=3)
    with pytest.warns(UserWarning, match=r"on_predict_epoch_end\(results\) is Lightning 1.x"):
        predictions = trainer.predict(module)
    assert predictions is not None and len(module.results) == 1  # one list per dataloader
    assert len(module.results[0]) == 3
    assert all(torch.equal(a, b) for a, b in zip(module.results[0], predictions, strict=True))


class _Stream(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter(torch.arange(40.0))


@pytest.mark.parametrize(
    "arguments",
    [
        {"batch_size": 2, "shuffle": True},
        {"batch_size": 2, "order": "topology_invariant", "drop_last": False},
        {"batch_sampler": [[i, i + 1] for i in range(0, 48, 2)]},
        {"batch_size": 2, "mode": poptorch.DataLoaderMode.Async, "num_workers": 1},
    ],
    ids=["shuffle", "order", "batch_sampler", "async"],
)
def test_a_rebuilt_loader_keeps_its_arguments(arguments: dict[str, Any]) -> None:
    """Rebuilt for the completed options, a user's loader yields what one built with them would."""
    stated = poptorch.Options().deviceIterations(2).randomSeed(5)
    completed = stated.clone()
    completed.Training.gradientAccumulation(3)
    data = torch.utils.data.TensorDataset(torch.arange(48.0))
    rebuilt = adopt_poptorch_loader(
        poptorch.DataLoader(stated, data, **arguments), completed, stated
    )
    direct = poptorch.DataLoader(completed.clone(), data, **arguments)
    got, want = [b[0].tolist() for b in rebuilt], [b[0].tolist() for b in direct]
    assert got == want and len(got[0]) == 2 * 2 * 3
    assert adopt_poptorch_loader(direct, completed, stated) is direct  # already right: kept


def test_a_rebuilt_stream_keeps_its_dataset() -> None:
    completed = poptorch.Options()
    completed.Training.gradientAccumulation(4)
    rebuilt = adopt_poptorch_loader(
        poptorch.DataLoader(poptorch.Options(), _Stream(), batch_size=2), completed, None
    )
    assert next(iter(rebuilt)).tolist() == list(range(8))
