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
  ``broadcast``, ``all_gather``) with Horovod across the instances poprun launched.

Options: ``training_opts`` / ``inference_opts`` are the user's ``poptorch.Options``; the
strategy fills in what they leave at PopTorch's defaults (``deviceIterations`` from
``device_iterations``, ``replicationFactor`` from ``devices``, ``gradientAccumulation``
from ``accumulate_grad_batches``) and raises :class:`IPUStrategyError` where they
contradict those arguments.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.utilities.types import ReduceOp
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies.parallel import ParallelStrategy
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_only as utils_rank_zero_only
from torch import Tensor
from torch.utils import data as tud
from torch.utils._pytree import tree_flatten

import popdist
import popdist_torch as poptorch
from popdist_lightning._loaders import to_poptorch_loader
from popdist_lightning._step import FlatStepModule, StepModule, flat_step_module
from popdist_lightning.environment import PopdistEnvironment
from popdist_lightning.errors import IPUStrategyError
from popdist_lightning.precision import IPUPrecision
from popdist_torch.pipeline import PipelineError, ShardedExecution, has_block_annotations

__all__ = ["IPUStrategy"]

_STEPS = {
    RunningStage.TRAINING: "training_step",
    RunningStage.SANITY_CHECKING: "validation_step",
    RunningStage.VALIDATING: "validation_step",
    RunningStage.TESTING: "test_step",
    RunningStage.PREDICTING: "predict_step",
}


_SHARDED_NOTE = (
    "IPUStrategy: the module's blocks run as ShardedExecution (gradient accumulation 1 cannot "
    "fill a pipeline); set accumulate_grad_batches >= the number of stages to pipeline them"
)


def _flat_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a step call is ``(batch, batch_idx)`` with a batch made of tensors."""
    if kwargs or len(args) != 2 or not isinstance(args[1], int):
        return False
    leaves = tree_flatten(args[0])[0]
    return bool(leaves) and all(isinstance(leaf, torch.Tensor) for leaf in leaves)


class IPUStrategy(ParallelStrategy):
    """Train and evaluate a LightningModule on popdist_torch's replicas, under poprun.

    ``device_iterations``: weight updates (or inference batches) per executor call, for
    options the user did not give. ``training_opts`` / ``inference_opts``: the user's
    ``poptorch.Options``. ``autoreport``: PopVision reports, which need Poplar: only
    ``False`` is accepted.
    """

    strategy_name = "ipu_strategy"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        device_iterations: int | None = None,
        autoreport: bool = False,
        autoreport_dir: str | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        training_opts: poptorch.Options | None = None,
        inference_opts: poptorch.Options | None = None,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment or PopdistEnvironment(),
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin or IPUPrecision(),
        )
        if autoreport or autoreport_dir is not None:
            raise IPUStrategyError(
                "IPUStrategy(autoreport=True / autoreport_dir=...): PopVision reports come from "
                "Poplar, which popdist_torch does not use; leave autoreport unset and profile "
                "with Trainer(profiler='simple') or torch.profiler"
            )
        if device_iterations is not None and (
            isinstance(device_iterations, bool)
            or not isinstance(device_iterations, int)
            or device_iterations < 1
        ):
            raise IPUStrategyError(
                f"IPUStrategy(device_iterations={device_iterations!r}): expected an integer >= 1"
            )
        for name, opts in (("training_opts", training_opts), ("inference_opts", inference_opts)):
            if opts is not None and not isinstance(opts, poptorch.Options):
                raise IPUStrategyError(
                    f"IPUStrategy({name}={type(opts).__name__}): expected poptorch.Options"
                )
        self.device_iterations = device_iterations
        self._user_training_opts = training_opts
        self._user_inference_opts = inference_opts
        self._accumulation: int | None = None
        self._training_opts: poptorch.Options | None = None
        self._inference_opts: poptorch.Options | None = None
        self._executors: dict[str, poptorch.PoplarExecutor] = {}
        self._steps: dict[str, StepModule] = {}
        self._pipelined = False

    # -- Lightning's view of the run ------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        """The host: the executor keeps the module where the user put it."""
        return torch.device("cpu")

    @property
    def replication_factor(self) -> int:
        """Local replicas: ``Trainer(devices=...)``."""
        return len(self.parallel_devices) if self.parallel_devices else 1

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
        if plugin is not None and not isinstance(plugin, IPUPrecision):
            if type(plugin) is not Precision:
                raise IPUStrategyError(
                    f"precision plugin {type(plugin).__name__} is not supported by "
                    f"IPUStrategy: it trains in float32 (leave Trainer(precision=...) at its "
                    f"default)"
                )
            plugin = IPUPrecision()
        self._precision_plugin = plugin

    # -- set-up ------------------------------------------------------------------------
    def setup_environment(self) -> None:
        """Check ``devices`` against the launch; start Horovod when there are instances."""
        self._check_accelerator()
        if popdist.isPopdistEnvSet() and self.replication_factor != popdist.getNumLocalReplicas():
            raise IPUStrategyError(
                f"Trainer(devices={self.replication_factor}) but poprun gave this instance "
                f"{popdist.getNumLocalReplicas()} local replicas (--num-replicas "
                f"{popdist.getNumTotalReplicas()} over {popdist.getNumInstances()} instances): "
                f"pass devices={popdist.getNumLocalReplicas()} or devices='auto'"
            )
        rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]
        utils_rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]
        if self.world_size > 1:
            popdist.init()
        super().setup_environment()

    def _check_accelerator(self) -> None:
        from popdist_lightning.accelerator import IPUAccelerator

        accelerator = self.accelerator
        if (
            accelerator is not None
            and not isinstance(accelerator, IPUAccelerator)
            and type(accelerator).__name__ != "CPUAccelerator"
        ):
            raise IPUStrategyError(
                f"IPUStrategy with accelerator {type(accelerator).__name__}: use "
                f"Trainer(accelerator='ipu')"
            )

    def setup(self, trainer: Any) -> None:
        """Check the Trainer's settings, capture accumulation, build the options."""
        self._check_trainer(trainer)
        if self._accumulation is None:
            self._accumulation = int(trainer.accumulate_grad_batches)
        trainer.accumulate_grad_batches = 1  # the executor accumulates
        trainer._accelerator_connector.use_distributed_sampler = False
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            self._check_optimizers()
        module = trainer.lightning_module
        self._pipelined = module is not None and has_block_annotations(module)
        self._training_opts = self._options(self._user_training_opts, "training_opts", True)
        self._inference_opts = self._options(self._user_inference_opts, "inference_opts", False)
        self._release_executors()

    def _check_trainer(self, trainer: Any) -> None:
        flag = trainer._accelerator_connector._precision_flag
        if flag not in ("32-true", "32", 32):
            raise IPUStrategyError(
                f"Trainer(precision={flag!r}) is not supported by IPUStrategy: it trains in "
                f"float32; leave precision at its default"
            )
        if trainer.gradient_clip_val:
            raise IPUStrategyError(
                f"Trainer(gradient_clip_val={trainer.gradient_clip_val}) is not supported by "
                f"IPUStrategy: the executor steps the optimizer inside its call; remove the "
                f"option (or clip inside the optimizer)"
            )
        module = trainer.lightning_module
        if module is not None and not module.automatic_optimization:
            raise IPUStrategyError(
                "automatic_optimization=False is not supported by IPUStrategy: the executor "
                "runs backward and the optimizer step; use automatic optimization"
            )

    def _check_optimizers(self) -> None:
        if len(self.optimizers) != 1 or type(self.optimizers[0]).__name__ == "_MockOptimizer":
            raise IPUStrategyError(
                f"configure_optimizers returned {len(self.optimizers)} optimizers: IPUStrategy "
                f"trains with exactly one (the executor steps it)"
            )

    def _options(
        self, user: poptorch.Options | None, name: str, training: bool
    ) -> poptorch.Options:
        """The user's options (or defaults) completed from the strategy's arguments."""
        opts = user.clone() if user is not None else poptorch.Options()
        replicas = self.replication_factor
        if opts.replication_factor != replicas:
            if opts.replication_factor != 1:
                raise IPUStrategyError(
                    f"{name}.replicationFactor({opts.replication_factor}) contradicts "
                    f"Trainer(devices={replicas}): set devices={opts.replication_factor} or drop "
                    f"the replicationFactor call (devices sets it)"
                )
            try:
                opts.replicationFactor(replicas)
            except RuntimeError:  # popdist.poptorch.Options: the launch fixes it
                raise IPUStrategyError(
                    f"{name} is a popdist.poptorch.Options with {opts.replication_factor} local "
                    f"replica(s) (the launch's) but Trainer(devices={replicas}): pass "
                    f"devices={opts.replication_factor} or devices='auto'"
                ) from None
        di = self.device_iterations
        if di is not None and opts.device_iterations != di:
            if opts.device_iterations != 1:
                raise IPUStrategyError(
                    f"{name}.deviceIterations({opts.device_iterations}) contradicts "
                    f"IPUStrategy(device_iterations={di}): give one of them"
                )
            opts.deviceIterations(di)
        if training:
            acc = self._accumulation or 1
            ga = opts.Training.gradient_accumulation
            if acc != 1 and ga not in (1, acc):
                raise IPUStrategyError(
                    f"training_opts.Training.gradientAccumulation({ga}) contradicts "
                    f"Trainer(accumulate_grad_batches={acc}): give one of them"
                )
            if acc != 1:
                opts.Training.gradientAccumulation(acc)
            if (
                self._pipelined
                and opts.execution_strategy is None
                and opts.Training.gradient_accumulation == 1
            ):
                # One micro-batch per weight update cannot fill a pipeline: run the stages
                # one after the other (same numbers); accumulation >= stages pipelines.
                rank_zero_info(_SHARDED_NOTE)
                opts.setExecutionStrategy(ShardedExecution())
        dist = opts.Distributed
        if (dist.processId, dist.numProcesses) != (self.global_rank, self.world_size):
            dist.configureProcessId(self.global_rank, self.world_size)
        return opts

    # -- data ----------------------------------------------------------------------------
    def process_dataloader(self, dataloader: object) -> object:
        """A torch DataLoader → a popdist_torch DataLoader for the current stage's options."""
        if not isinstance(dataloader, tud.DataLoader):
            return dataloader
        stage = self.lightning_module.trainer.state.stage if self.lightning_module else None
        training = stage == RunningStage.TRAINING
        opts = self._training_opts if training else self._inference_opts
        assert opts is not None, "IPUStrategy.setup() builds the options first"
        if isinstance(dataloader, poptorch.DataLoader):
            self._check_loader(dataloader, opts)
            return dataloader
        loader_opts = opts.clone()
        self._seed_shuffling(dataloader, loader_opts)
        return to_poptorch_loader(dataloader, loader_opts)

    def _check_loader(self, loader: poptorch.DataLoader, opts: poptorch.Options) -> None:
        theirs = loader.options
        mine = (
            opts.device_iterations,
            opts.replication_factor,
            opts.Training.gradient_accumulation,
        )
        got = (
            theirs.device_iterations,
            theirs.replication_factor,
            theirs.Training.gradient_accumulation,
        )
        if got != mine:
            raise IPUStrategyError(
                f"a poptorch.DataLoader built with (deviceIterations, replicationFactor, "
                f"gradientAccumulation) = {got} feeds a model run with {mine}: build it with the "
                f"strategy's options, or return a torch DataLoader and let IPUStrategy rebuild it"
            )

    def _seed_shuffling(self, loader: tud.DataLoader[Any], opts: poptorch.Options) -> None:
        """Instances must shuffle alike: seed from ``seed_everything`` when options have none."""
        shuffles = isinstance(getattr(loader, "sampler", None), tud.RandomSampler)
        if not shuffles or self.world_size == 1 or opts.random_seed is not None:
            return
        seed = os.environ.get("PL_GLOBAL_SEED")
        if seed is None:
            raise IPUStrategyError(
                "a shuffled DataLoader over several instances needs one seed everywhere: call "
                "lightning.pytorch.seed_everything(...) before the Trainer, or set "
                "training_opts.randomSeed(...)"
            )
        opts.randomSeed(int(seed))

    def batch_to_device(
        self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0
    ) -> Any:
        """The batch stays on the host: the executor splits it over the replicas."""
        return batch

    def model_to_device(self) -> None:
        """Nothing to move: the executor runs the module where it is."""

    # -- steps ---------------------------------------------------------------------------
    def _executor(
        self, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[poptorch.PoplarExecutor, StepModule]:
        executor = self._executors.get(step)
        if executor is None:
            module = self.lightning_module
            assert module is not None
            wrapper = (
                flat_step_module(module, step, args[0])
                if _flat_call(args, kwargs)
                else StepModule(module, step)
            )
            if self._pipelined and not isinstance(wrapper, FlatStepModule):
                raise IPUStrategyError(
                    f"a pipelined LightningModule's {step} takes (batch, batch_idx) with a "
                    f"batch made of tensors under IPUStrategy (one dataloader)"
                )
            if step == "training_step":
                executor = poptorch.trainingModel(
                    wrapper, self._training_opts, optimizer=self.optimizers[0]
                )
            else:
                executor = poptorch.inferenceModel(wrapper, self._inference_opts)
            self._executors[step] = executor
            self._steps[step] = wrapper
        return executor, self._steps[step]

    def _call(self, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        executor, wrapper = self._executor(step, args, kwargs)
        if isinstance(wrapper, FlatStepModule):
            return executor(*wrapper.inputs(args[0]), torch.tensor(args[1]))
        return executor(*args, **kwargs)

    def _run(self, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            outputs = self._call(step, args, kwargs)
        except PipelineError:
            # Block(ipu_id=...) contexts found on the first call staged the model as a
            # pipeline, which one micro-batch per update cannot fill: shard it instead.
            opts = self._training_opts
            assert opts is not None
            if (
                step != "training_step"
                or opts.execution_strategy is not None
                or opts.Training.gradient_accumulation != 1
            ):
                raise
            rank_zero_info(_SHARDED_NOTE)
            opts.setExecutionStrategy(ShardedExecution())
            self._executors.pop(step).destroy()
            outputs = self._call(step, args, kwargs)
        wrapper = self._steps[step]
        values, result = wrapper.split(outputs)
        module = self.lightning_module
        assert module is not None
        for (name, log_kwargs), value in zip(wrapper.calls, values, strict=True):
            module.log(name, value.float().mean(), **log_kwargs)
        return result

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

    # -- collectives -----------------------------------------------------------------------
    def _hvd(self) -> Any:
        import horovod.torch as hvd

        popdist.init()
        return hvd

    def reduce(
        self, tensor: Any, group: Any | None = None, reduce_op: ReduceOp | str | None = "mean"
    ) -> Any:
        """Reduce ``tensor`` across instances (``mean`` by default; ``sum``, ``max``, ``min``)."""
        if not isinstance(tensor, Tensor) or self.world_size == 1:
            return tensor
        hvd = self._hvd()
        op_name = getattr(reduce_op, "name", reduce_op)
        op_name = str(op_name or "mean").lower()
        ops = {
            "mean": hvd.Average,
            "avg": hvd.Average,
            "sum": hvd.Sum,
            "max": hvd.Max,
            "min": hvd.Min,
        }
        if op_name not in ops:
            raise IPUStrategyError(
                f"reduce_op={reduce_op!r} is not supported by IPUStrategy: use one of {sorted(ops)}"
            )
        return hvd.allreduce(tensor.detach().clone(), op=ops[op_name])

    def barrier(self, name: str | None = None) -> None:
        """Wait for every instance."""
        if self.world_size > 1:
            self._hvd().barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Instance ``src``'s ``obj`` on every instance."""
        if self.world_size == 1:
            return obj
        return self._hvd().broadcast_object(obj, root_rank=src)

    def all_gather(
        self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False
    ) -> Tensor:
        """Every instance's ``tensor``, stacked along a new leading dimension."""
        if self.world_size == 1:
            return tensor.unsqueeze(0)
        return self._hvd().allgather(tensor.detach().unsqueeze(0))

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """``decision`` of all instances (``all=True``) or of any."""
        if self.world_size == 1:
            return decision
        total = int(self.reduce(torch.tensor(int(decision)), reduce_op="sum").item())
        return total == self.world_size if all else total > 0

    # -- tear-down -----------------------------------------------------------------------
    def _release_executors(self) -> None:
        for executor in self._executors.values():
            executor.destroy()
        self._executors.clear()
        self._steps.clear()

    def teardown(self) -> None:
        """Release the executors (their gradient hooks) and Lightning's state."""
        self._release_executors()
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
