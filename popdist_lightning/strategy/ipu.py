"""``IPUStrategy``: Lightning's training loop driving popdist_torch's executor.

One Lightning batch is one executor call: ``deviceIterations`` weight updates (training)
or batches (inference) over this instance's local replicas, each replica on its
micro-batch (the user's ``batch_size``). The strategy

* rebuilds each DataLoader as a popdist_torch ``DataLoader`` (the user's loader is never
  given Lightning's distributed sampler);
* wraps each step method (``training_step``, ``validation_step``, ...) in a module the
  executor runs (``trainingModel`` with the optimizer from ``configure_optimizers``,
  ``inferenceModel`` for the others), and logs what the step logged;
* turns ``Trainer(accumulate_grad_batches=N)`` into the executor's gradient accumulation
  and Lightning's own count into 1;
* answers Lightning's collectives (``reduce`` for ``sync_dist``, ``barrier``,
  ``broadcast``, ``all_gather``) across the instances poprun launched, on the run's
  collectives backend (Horovod or torch.distributed, :mod:`popdist_lightning.collectives`).

Options: ``training_opts`` / ``inference_opts`` are the user's ``poptorch.Options``; the
strategy fills in what they leave at PopTorch's defaults (``deviceIterations`` from
``device_iterations``, ``replicationFactor`` from ``devices``, ``gradientAccumulation``
from ``accumulate_grad_batches``) and raises :class:`IPUStrategyError` where they
contradict those arguments.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from torch import Tensor
from torch.utils import data as tud

import popdist
import popdist_lightning.collectives as collectives
import popdist_torch as poptorch
from popdist_lightning.environment import PopdistEnvironment
from popdist_lightning.epoch_outputs import connect_legacy_hooks
from popdist_lightning.precision import IPUPrecision, as_ipu_precision
from popdist_lightning.strategy.checks import (
    check_accelerator,
    check_arguments,
    check_devices,
    check_optimizers,
    check_trainer,
)
from popdist_lightning.strategy.executors import StepExecutors
from popdist_lightning.strategy.loaders import adopt_poptorch_loader, to_poptorch_loader
from popdist_lightning.strategy.options import (
    complete_options,
    resolve_replicas,
    seed_shuffling,
)
from popdist_lightning.strategy.report import make_report
from popdist_torch.pipeline import has_block_annotations

__all__ = ["IPUStrategy"]


class IPUStrategy(ParallelStrategy):
    """Train and evaluate a LightningModule on popdist_torch's replicas, under poprun.

    ``device_iterations``: weight updates (or inference batches) per executor call, for
    options the user did not give. ``training_opts`` / ``inference_opts``: the user's
    ``poptorch.Options``; a ``replicationFactor(n)`` there gives the replicas when
    ``Trainer(devices=...)`` is 1 or left out. ``autoreport=True``: write the executor's
    schedule profile to ``autoreport_dir`` (default: ``<default_root_dir>/autoreport``)
    when each Trainer stage ends (:mod:`~popdist_lightning.strategy.report`), where
    Lightning 1.9 had Poplar write PopVision reports; ``autoreport_options`` (Poplar's
    ``autoReport.*`` engine options) are recorded in it.
    """

    strategy_name = "ipu_strategy"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        device_iterations: int | None = None,
        autoreport: bool = False,
        autoreport_dir: str | os.PathLike[str] | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        training_opts: poptorch.Options | None = None,
        inference_opts: poptorch.Options | None = None,
        autoreport_options: dict[str, Any] | None = None,
    ) -> None:
        check_arguments(
            autoreport,
            autoreport_dir,
            autoreport_options,
            device_iterations,
            training_opts,
            inference_opts,
        )
        self._user_training_opts = training_opts
        self._user_inference_opts = inference_opts
        self._replicas_source = "Trainer(devices=1)"
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment or PopdistEnvironment(),
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin or IPUPrecision(),
        )
        self.device_iterations = device_iterations
        self._report = make_report(autoreport, autoreport_dir, autoreport_options)
        self._accumulation: int | None = None
        self._pipelined = False
        self._step_executors = StepExecutors()

    # -- Lightning's view of the run ------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        """The host: the executor keeps the module where the user put it."""
        return torch.device("cpu")

    @property
    def replication_factor(self) -> int:
        """Local replicas: ``Trainer(devices=...)``, or the user's ``replicationFactor``."""
        return len(self.parallel_devices) if self.parallel_devices else 1

    @property
    def parallel_devices(self) -> list[torch.device] | None:
        """One entry per local replica (what ``trainer.num_devices`` counts)."""
        return self._parallel_devices

    @parallel_devices.setter
    def parallel_devices(self, devices: list[torch.device] | None) -> None:
        # Lightning sets ``devices``' list; the user's replicationFactor may widen it.
        self._parallel_devices, self._replicas_source = resolve_replicas(
            devices, self._user_training_opts, self._user_inference_opts
        )

    @property
    def is_distributed(self) -> bool:
        """True with more than one instance (so ``self.log(sync_dist=True)`` reduces)."""
        return self.world_size > 1

    @property
    def handles_gradient_accumulation(self) -> bool:
        """The executor accumulates; Lightning steps once per executor call."""
        return True

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """The instance's place (Lightning's distributed sampler is never injected)."""
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    @property
    def precision_plugin(self) -> Precision:
        """:class:`IPUPrecision` (a plain float32 plugin Lightning assigns is replaced)."""
        return self._precision_plugin if self._precision_plugin is not None else IPUPrecision()

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        self._precision_plugin = as_ipu_precision(plugin)

    # -- set-up ------------------------------------------------------------------------
    def connect(self, model: Any) -> None:
        """Refuse Lightning 1.x hooks Lightning 2 would skip; call 1.9's ``*_epoch_end(outputs)``."""
        connect_legacy_hooks(model, getattr(model, "_trainer", None))
        super().connect(model)

    def setup_environment(self) -> None:
        """Check ``devices`` against the launch; start the collectives when there are instances."""
        check_accelerator(self.accelerator)
        check_devices(self.replication_factor, self._replicas_source)
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]
        utils_rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]
        if self.world_size > 1:
            popdist.init()
        super().setup_environment()

    def setup(self, trainer: Any) -> None:
        """Check the Trainer's settings, capture accumulation, build the options."""
        check_trainer(trainer)
        if self._accumulation is None:
            self._accumulation = int(trainer.accumulate_grad_batches)
        trainer.accumulate_grad_batches = 1  # the executor accumulates
        trainer._accelerator_connector.use_distributed_sampler = False
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            check_optimizers(self.optimizers)
        module = trainer.lightning_module
        self._pipelined = module is not None and has_block_annotations(module)
        self._step_executors.configure(
            self._options(self._user_training_opts, "training_opts", True),
            self._options(self._user_inference_opts, "inference_opts", False),
            self._pipelined,
        )
        if self._report is not None:
            self._report.start(Path(trainer.default_root_dir) / "autoreport")
        self._step_executors.report = self._report

    def _options(
        self, user: poptorch.Options | None, name: str, training: bool
    ) -> poptorch.Options:
        return complete_options(
            user,
            name,
            replicas=self.replication_factor,
            replicas_source=self._replicas_source,
            device_iterations=self.device_iterations,
            accumulation=(self._accumulation or 1) if training else None,
            pipelined=self._pipelined,
            rank=self.global_rank,
            world_size=self.world_size,
        )

    # -- data ----------------------------------------------------------------------------
    def process_dataloader(self, dataloader: object) -> object:
        """A torch DataLoader → a popdist_torch DataLoader for the current stage's options."""
        if not isinstance(dataloader, tud.DataLoader):
            return dataloader
        stage = self.lightning_module.trainer.state.stage if self.lightning_module else None
        training = stage == RunningStage.TRAINING
        runs = self._step_executors
        opts = runs.training_opts if training else runs.inference_opts
        assert opts is not None, "IPUStrategy.setup() builds the options first"
        if isinstance(dataloader, poptorch.DataLoader):
            stated = self._user_training_opts if training else self._user_inference_opts
            return adopt_poptorch_loader(dataloader, opts, stated)
        loader_opts = opts.clone()
        seed_shuffling(dataloader, loader_opts, self.world_size)
        return to_poptorch_loader(dataloader, loader_opts)

    def batch_to_device(
        self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0
    ) -> Any:
        """The batch stays on the host: the executor splits it over the replicas."""
        return batch

    def model_to_device(self) -> None:
        """Nothing to move: the executor runs the module where it is."""

    # -- steps (popdist_lightning.strategy.executors) -------------------------------------------------
    def _run(self, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        module = self.lightning_module
        assert module is not None
        optimizer = self.optimizers[0] if step == "training_step" else None
        return self._step_executors.run(module, optimizer, step, args, kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """One executor call: ``deviceIterations`` weight updates; returns the mean loss."""
        with self.precision_plugin.train_step_context():
            loss = self._run("training_step", args, kwargs)
        return loss.float().mean()

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """One inference call of ``validation_step`` over the combined batch."""
        with self.precision_plugin.val_step_context():
            return self._run("validation_step", args, kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """One inference call of ``test_step`` over the combined batch."""
        with self.precision_plugin.test_step_context():
            return self._run("test_step", args, kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """One inference call of ``predict_step``: the predictions of the combined batch."""
        with self.precision_plugin.predict_step_context():
            return self._run("predict_step", args, kwargs)

    # -- collectives (on the run's backend: popdist_lightning.collectives) ---------------------
    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        """Reduce ``tensor`` across instances (``mean`` by default; ``sum``, ``max``, ``min``)."""
        return collectives.reduce(tensor, reduce_op)

    def barrier(self, name: str | None = None) -> None:
        """Wait for every instance."""
        collectives.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Instance ``src``'s ``obj`` on every instance."""
        return collectives.broadcast(obj, src)

    def all_gather(
        self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False
    ) -> Tensor:
        """Every instance's ``tensor``, stacked along a new leading dimension."""
        return collectives.all_gather(tensor)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """``decision`` of all instances (``all=True``) or of any."""
        return collectives.reduce_boolean_decision(decision, all)

    # -- tear-down -----------------------------------------------------------------------
    def teardown(self) -> None:
        """Write the autoreport; release the executors (their gradient hooks) and Lightning's state."""
        if self._report is not None:
            runs = self._step_executors
            self._report.write(
                runs.training_opts, runs.inference_opts, self.global_rank, self.world_size
            )
        self._step_executors.release()
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register as "ipu_strategy" (replacing a previous registration of the name)."""
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="popdist_torch's executor under poprun (PopTorch's IPU model)",
            override=True,
        )
