"""IPUStrategy in one process: the same weights as ``Trainer(accelerator="cpu")`` on the same
samples, logging, evaluation, prediction, checkpoints and the errors for what it refuses.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import popdist_torch as poptorch
import popdist_torch.pipeline
from popdist_lightning import IPUPrecision, IPUStrategy, IPUStrategyError
from tests.lightning.cases import (
    QUIET,
    SAMPLES,
    Classifier,
    cpu_reference,
    max_difference,
    plain_environment,
)

pytestmark = pytest.mark.filterwarnings("ignore")
MICRO = 2


def ipu_trainer(devices: int | str = 2, strategy: Any = None, **kwargs: Any) -> pl.Trainer:
    """A quiet ``Trainer(accelerator="ipu")`` that keeps no checkpoints unless asked."""
    if "callbacks" not in kwargs or not any(
        isinstance(c, ModelCheckpoint) for c in kwargs["callbacks"]
    ):
        kwargs.setdefault("enable_checkpointing", False)
    if strategy is not None:
        kwargs["strategy"] = strategy
    return pl.Trainer(accelerator="ipu", devices=devices, **QUIET, **kwargs)


@pytest.mark.parametrize(
    ("devices", "device_iterations", "accumulation"),
    [(1, 1, 1), (2, 1, 1), (2, 4, 1), (4, 2, 1), (2, 1, 2), (2, 2, 3)],
)
def test_same_weights_as_the_cpu_trainer(
    devices: int, device_iterations: int, accumulation: int
) -> None:
    model = Classifier(MICRO)
    trainer = ipu_trainer(
        devices,
        IPUStrategy(device_iterations=device_iterations),
        max_epochs=2,
        accumulate_grad_batches=accumulation,
    )
    trainer.fit(model)
    reference = cpu_reference(devices, MICRO, accumulation, epochs=2)
    assert max_difference(model, reference) < 1e-6
    # One Lightning step is one executor call: device_iterations weight updates.
    per_call = MICRO * devices * device_iterations * accumulation
    assert trainer.global_step == 2 * (SAMPLES // per_call)
    assert trainer.accumulate_grad_batches == 1  # the executor accumulates, not Lightning


def test_accelerator_ipu_alone_picks_the_ipu_strategy_and_spawns_nothing() -> None:
    model = Classifier(MICRO)
    trainer = ipu_trainer(4, max_epochs=1)
    assert isinstance(trainer.strategy, IPUStrategy)
    assert trainer.strategy.launcher is None  # no process is created by Lightning
    assert trainer.num_devices == 4
    trainer.fit(model)
    assert isinstance(trainer.strategy.precision_plugin, IPUPrecision)
    assert max_difference(model, cpu_reference(4, MICRO, 1, epochs=1)) < 1e-6


def test_training_options_win_and_their_loss_outputs_follow_the_output_mode() -> None:
    opts = poptorch.Options().deviceIterations(3)
    opts.outputMode(poptorch.OutputMode.All)
    model = Classifier(MICRO)
    seen: list[torch.Tensor] = []

    class Keep(pl.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, *a: Any) -> None:
            seen.append(outputs["loss"])

    trainer = ipu_trainer(2, IPUStrategy(training_opts=opts), max_epochs=1, callbacks=[Keep()])
    trainer.fit(model)
    assert trainer.global_step == SAMPLES // (MICRO * 2 * 3)
    assert max_difference(model, cpu_reference(2, MICRO, 1, epochs=1)) < 1e-6
    assert all(loss.dim() == 0 for loss in seen)


def test_logged_values_are_the_mean_over_replicas_and_match_the_cpu_trainer() -> None:
    model = Classifier(MICRO)
    ipu = ipu_trainer(2, IPUStrategy(device_iterations=2), max_epochs=1)
    ipu.fit(model)
    reference = Classifier(2 * MICRO)
    cpu = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        enable_checkpointing=False,
        plugins=[plain_environment()],
        **QUIET,
    )
    cpu.fit(reference)
    # The last update's loss (OutputMode.Final): the mean over the two replicas' micro-batches
    # is the CPU trainer's loss of its last batch.
    assert float(ipu.callback_metrics["train_loss"]) == pytest.approx(
        float(cpu.callback_metrics["train_loss"]), rel=1e-5
    )
    assert float(ipu.callback_metrics["val_loss"]) == pytest.approx(
        float(cpu.callback_metrics["val_loss"]), rel=1e-5
    )
    got = ipu.validate(model, verbose=False)[0]
    want = cpu.validate(reference, verbose=False)[0]
    assert got.keys() == want.keys() == {"val_loss"}
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-5)
    got_test = ipu.test(model, verbose=False)[0]
    want_test = cpu.test(reference, verbose=False)[0]
    assert got_test["test_acc"] == pytest.approx(want_test["test_acc"], abs=1e-6)


def test_predictions_come_back_in_sample_order() -> None:
    model = Classifier(MICRO)
    predictions = ipu_trainer(2, IPUStrategy(device_iterations=4)).predict(model)
    assert predictions is not None
    got = torch.cat(predictions)  # type: ignore[arg-type]
    reference = Classifier(MICRO)
    with torch.no_grad():
        want = reference(torch.stack([x for x, _ in reference._loader().dataset]))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)


def test_checkpoint_resume_ends_where_an_uninterrupted_run_ends(tmp_path: Path) -> None:
    straight = Classifier(MICRO)
    ipu_trainer(2, IPUStrategy(device_iterations=2), max_epochs=3).fit(straight)

    first = Classifier(MICRO)
    save = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_train_steps=5)
    trainer = ipu_trainer(
        2, IPUStrategy(device_iterations=2), max_epochs=3, max_steps=5, callbacks=[save]
    )
    trainer.fit(first)  # stops mid-epoch, after 5 of 24 steps
    (ckpt,) = tmp_path.glob("*.ckpt")
    resumed = Classifier(MICRO)
    ipu_trainer(2, IPUStrategy(device_iterations=2), max_epochs=3).fit(resumed, ckpt_path=ckpt)
    assert max_difference(resumed, straight) == 0.0
    assert max_difference(first, straight) > 1e-3  # the check above could fail


def test_accumulation_from_the_options_or_the_trainer_agrees() -> None:
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    model = Classifier(MICRO)
    ipu_trainer(2, IPUStrategy(training_opts=opts), max_epochs=1).fit(model)
    assert max_difference(model, cpu_reference(2, MICRO, 2, epochs=1)) < 1e-6


def _fails(strategy: Any = None, devices: int = 2, **kwargs: Any) -> str:
    with pytest.raises(IPUStrategyError) as info:
        ipu_trainer(devices, strategy, max_epochs=1, **kwargs).fit(Classifier(MICRO))
    return str(info.value)


def test_conflicting_settings_are_errors_that_name_both() -> None:
    opts = poptorch.Options().replicationFactor(4)
    assert "replicationFactor(4)" in _fails(IPUStrategy(training_opts=opts), devices=2)
    assert "devices=2" in _fails(IPUStrategy(training_opts=opts), devices=2)
    opts = poptorch.Options().deviceIterations(8)
    message = _fails(IPUStrategy(device_iterations=4, training_opts=opts))
    assert "deviceIterations(8)" in message and "device_iterations=4" in message
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    message = _fails(IPUStrategy(training_opts=opts), accumulate_grad_batches=2)
    assert "gradientAccumulation(3)" in message and "accumulate_grad_batches=2" in message


def test_popdist_options_outside_poprun_hold_one_replica() -> None:
    import popdist.poptorch

    model = Classifier(MICRO)
    opts = popdist.poptorch.Options()
    ipu_trainer(1, IPUStrategy(training_opts=opts), max_epochs=1).fit(model)
    assert max_difference(model, cpu_reference(1, MICRO, 1, epochs=1)) < 1e-6
    message = _fails(IPUStrategy(training_opts=popdist.poptorch.Options()), devices=2)
    assert "popdist.poptorch.Options" in message and "devices=1" in message


def test_unsupported_options_are_named() -> None:
    assert "gradient_clip_val" in _fails(IPUStrategy(), gradient_clip_val=1.0)
    with pytest.raises(IPUStrategyError, match="device_iterations=0"):
        IPUStrategy(device_iterations=0)

    class Manual(Classifier):
        def __init__(self) -> None:
            super().__init__(MICRO)
            self.automatic_optimization = False

    with pytest.raises(IPUStrategyError, match="automatic_optimization"):
        ipu_trainer(2, max_epochs=1).fit(Manual())

    class NoOptimizer(Classifier):
        def configure_optimizers(self) -> Any:
            return None

    with pytest.raises(IPUStrategyError, match="exactly one"):
        ipu_trainer(2, max_epochs=1).fit(NoOptimizer(MICRO))

    with pytest.raises(IPUStrategyError, match="devices='nope'"):
        ipu_trainer("nope")


def test_poprun_local_replicas_must_match_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "POPDIST_NUM_TOTAL_REPLICAS": "4",
        "POPDIST_NUM_IPUS_PER_REPLICA": "1",
        "POPDIST_NUM_LOCAL_REPLICAS": "4",
        "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1",
        "POPDIST_REPLICA_INDEX_OFFSET": "0",
        "POPDIST_LOCAL_INSTANCE_INDEX": "0",
        "POPDIST_NUM_INSTANCES": "1",
        "POPDIST_INSTANCE_INDEX": "0",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    import popdist

    if not popdist.isPopdistEnvSet():  # the contract grew: this test cannot fake poprun
        pytest.fail("the faked poprun environment is incomplete; update this test")
    message = _fails(devices=2)
    assert "devices=2" in message and "4 local replicas" in message
    assert ipu_trainer("auto").num_devices == 4


def test_logging_something_the_executor_cannot_return_is_named() -> None:
    class LogsAString(Classifier):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.log("tag", "text")  # type: ignore[arg-type]
            return super().training_step(batch, batch_idx)

    with pytest.raises(IPUStrategyError, match=r"self.log\('tag', str\)"):
        ipu_trainer(2, max_epochs=1).fit(LogsAString(MICRO))


def test_shuffled_data_trains_on_every_sample_once_per_epoch() -> None:
    seen: list[torch.Tensor] = []

    class Shuffled(Classifier):
        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(
                torch.utils.data.TensorDataset(torch.arange(SAMPLES).float()),
                batch_size=MICRO,
                shuffle=True,
            )

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            (x,) = batch
            return (self.net[0].bias.sum() * x.sum()) * 0.0 + self.net[0].bias.sum() * 0.0

    class Record(pl.Callback):
        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, i: int) -> None:
            seen.append(batch[0])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ipu_trainer(2, IPUStrategy(device_iterations=4), max_epochs=1, callbacks=[Record()]).fit(
            Shuffled(MICRO)
        )
    order = torch.cat(seen)
    assert sorted(order.tolist()) == list(range(SAMPLES))
    assert order.tolist() != list(range(SAMPLES))


def test_import_popdist_torch_does_not_import_lightning() -> None:
    code = (
        "import sys, popdist_torch, popdist_torch.pipeline; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'popdist_lightning')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"


class _Staged(Classifier):
    """The Classifier split in two blocks: by BeginBlock, or by Block contexts in forward."""

    def __init__(self, batch_size: int, how: str) -> None:
        super().__init__(batch_size)
        self.how = how
        if how == "begin_block":
            self.net[0] = poptorch.BeginBlock(self.net[0], ipu_id=0)
            self.net[2] = poptorch.BeginBlock(self.net[2], ipu_id=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how != "block":
            return self.net(x)
        with poptorch.Block(ipu_id=0):
            x = self.net[1](self.net[0](x))
        with poptorch.Block(ipu_id=1):
            return self.net[2](x)


@pytest.mark.parametrize(
    ("how", "accumulation"), [("begin_block", 1), ("begin_block", 4), ("block", 1), ("block", 4)]
)
def test_staged_modules_train_like_the_cpu_trainer(how: str, accumulation: int) -> None:
    model = _Staged(MICRO, how)
    trainer = ipu_trainer(
        2, IPUStrategy(device_iterations=2), max_epochs=1, accumulate_grad_batches=accumulation
    )
    with poptorch.pipeline.record_schedule() as events:
        trainer.fit(model)
    # it ran in two stages: forward and backward of stage 0 and of stage 1
    assert {(e.stage, e.kind) for e in events} == {(0, "F"), (0, "B"), (1, "F"), (1, "B")}
    assert max_difference(model, cpu_reference(2, MICRO, accumulation, epochs=1)) < 1e-6
