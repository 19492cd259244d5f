"""``trainingModel`` / ``inferenceModel``: PopTorch's data-parallel executor on torch.

One call takes a batch whose leading dimension is ``deviceIterations × gradientAccumulation
× localReplicas × micro-batch`` (PopART's host layout ``[device_iterations, accumulation,
replica, micro_batch, ...]``, :class:`~popdist_torch.execution.batch.Batch`).  For each device
iteration the executor's *replica runner* (:mod:`popdist_torch.execution.runners`) runs, for
each accumulation step, every local replica's forward and backward on its micro-batch;
gradients accumulate in the parameters' ``.grad``; the cross-instance allreduce
(:mod:`popdist_torch.execution.reducer`, fused, overlapped with the last backward) happens
once per weight update; then the optimizer steps.  The user's module is the model: it holds
the current weights after every call, and a training and an inference model of the same
module share them.

What runs where is decided once, when the model is wrapped: the options, the model's facts
and the process's world resolve into one frozen plan
(:mod:`popdist_torch.execution.setup`), and the executor builds its pieces from it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from typing import Any

import torch
from torch import nn

from popdist import progress
from popdist.collectives.base import Collectives
from popdist.env import read_compute_threads
from popdist_torch.enums import OutputMode, ReductionType
from popdist_torch.errors import ExecutorError, ExecutorStateError
from popdist_torch.execution.batch import Batch
from popdist_torch.execution.device import DeviceSide
from popdist_torch.execution.observation import Observation
from popdist_torch.execution.outputs import OutputCollector
from popdist_torch.execution.placement import (
    instance_device,
    move_optimizer_state,
    optimizer_state_on_device,
    place,
    to_host,
)
from popdist_torch.execution.reducer import GradientReducer, broadcast_state, connect
from popdist_torch.execution.runners import ReplicaRunner
from popdist_torch.execution.setup import (
    ExecutorPlan,
    announce_idle_gpus,
    model_facts,
    read_world,
    resolve,
)
from popdist_torch.execution.setup.build import runner_for
from popdist_torch.optim import SGD, PopTorchOptimizer, check_constants, loss_scaling_of
from popdist_torch.optim.sharded import StateShards, step
from popdist_torch.options import Options
from popdist_torch.surface.loss import mark_loss

__all__ = [
    "ExecutorError",
    "PoplarExecutor",
    "identity_loss",
    "inferenceModel",
    "trainingModel",
]


def identity_loss(x: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """Mark ``x`` as the loss, reduced by ``"sum"``, ``"mean"`` or ``"none"`` (kept as it is).

    The tensor returned is the loss wherever the model's output holds it, whatever its shape
    (docs/executor.md, the loss rule); ``"none"`` keeps the shape, and backward seeds every
    element's gradient, as PopTorch does. Traced by torch.fx (a staged model), it stays one
    call in the graph, so the stage that computes it marks it as it runs; in a TorchScript
    model it reduces only (the loss is then found by the rule's second part).
    """
    if torch.jit.is_scripting():  # type: ignore[attr-defined]
        return _reduced(x, reduction)
    return _marked(x, reduction)


def _reduced(x: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "sum":
        return x.sum()
    if reduction == "mean":
        return x.mean()
    if reduction == "none":
        return x
    # no f-string conversion: TorchScript compiles this function too
    raise ExecutorError(
        "identity_loss(reduction='" + reduction + "'): expected 'sum', 'mean' or 'none'"
    )


@torch.jit.unused
def _marked(x: torch.Tensor, reduction: str) -> torch.Tensor:
    """``identity_loss`` in Python: marked for the loss rule, or one call in a torch.fx graph."""
    from torch import fx

    if isinstance(x, fx.Proxy):
        return x.tracer.create_proxy("call_function", identity_loss, (x, reduction), {})
    return mark_loss(_reduced(x, reduction))


def _resolved(options: Options | None, *, training: bool) -> Options:
    """A copy of ``options`` with the output mode resolved, checked for this model kind."""
    opts = (options or Options()).clone()
    if opts.output_mode == OutputMode.Default:
        opts.outputMode(OutputMode.Final if training else OutputMode.All)
    if opts.output_mode == OutputMode.EveryN and opts.device_iterations % opts.output_return_period:
        raise ExecutorError(
            f"outputMode(EveryN, output_return_period={opts.output_return_period}) needs "
            f"deviceIterations ({opts.device_iterations}) to be a multiple of the period"
        )
    if not training and opts.Training.gradient_accumulation != 1:
        raise ExecutorError(
            f"gradientAccumulation is {opts.Training.gradient_accumulation} for an inference "
            f"model: you must set Options().Training.gradientAccumulation(1) (or leave the "
            f"default) when using inferenceModel"
        )
    return opts


def _connect(
    model: nn.Module, opts: Options, optimizer: torch.optim.Optimizer | None, plan: ExecutorPlan
) -> tuple[Collectives | None, GradientReducer | None]:
    """Join the other instances: start from instance 0's state; the plan's reducer.

    The collectives are ``None`` when they connect no other process (one process: the local
    backend).
    """
    dist = opts.Distributed
    collectives = connect(dist.numProcesses, dist.processId)
    deterministic = plan.runner == "deterministic"
    threads = read_compute_threads(deterministic=deterministic)
    if threads is not None and (plan.communicates or deterministic):
        torch.set_num_threads(threads)
    if not plan.communicates:
        return None, None
    broadcast_state(collectives, model, optimizer, buffers=opts.broadcast_buffers)
    if not plan.reducer:
        return collectives, None
    return collectives, GradientReducer(collectives, model.named_parameters(), average=plan.average)


def _shards(
    opts: Options, plan: ExecutorPlan, collectives: Collectives | None
) -> StateShards | None:
    """The optimizer-state shards when the plan shards it over the other instances."""
    if not plan.shards or collectives is None:
        return None
    return StateShards(collectives, opts.TensorLocations.sharding_min_elements)


class PoplarExecutor(DeviceSide, Observation):
    """A wrapped model (PopTorch's name): call it with a whole batch per call."""

    def __init__(
        self,
        model: nn.Module,
        options: Options | None,
        *,
        training: bool,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise ExecutorError(f"expected a torch.nn.Module, got {type(model).__name__}")
        opts = _resolved(options, training=training)
        self._facts = facts = model_facts(model, opts)
        self._optimizer: torch.optim.Optimizer | None = None
        if training:
            self._optimizer = optimizer or SGD(model.parameters(), lr=0.01)
            if facts.staged:
                from popdist_torch.pipeline import check_accumulation

                check_accumulation(opts.execution_strategy, opts.Training.gradient_accumulation)
        elif optimizer is not None:
            raise ExecutorError("inferenceModel takes no optimizer; use trainingModel to train")
        self._user_model = model
        self._options = opts
        self._training = training
        self._attached = True
        self._destroyed = False
        self._compiled = False
        # Where an unstaged model computes (the instance's GPU when it has one), then the plan.
        num = opts.Distributed.numProcesses
        self._world = read_world(opts, instance_device(pipelined=False, num_processes=num))
        plan = resolve(opts, facts, self._world, training=training)
        place(model, self._optimizer, plan.device)  # before the broadcast, which then runs there
        collectives, self._reducer = _connect(model, opts, self._optimizer, plan)
        self._collectives = collectives
        self._shards = _shards(opts, plan, collectives)
        self._adopt(plan)
        self._observe(plan.device)
        announce_idle_gpus(plan, self._world, opts)

    def _adopt(self, plan: ExecutorPlan) -> None:
        """Build the runner of ``plan`` (at wrap time, and when a first call stages the model)."""
        self._plan, self._device, self._watch_blocks = plan, plan.device, plan.watch_blocks
        self._to_host = plan.outputs_to_host
        # Stages on several GPUs move their parameters: the optimizer state follows, once.
        self._place_state = plan.stage_gpus > 1 and self._optimizer is not None
        self._runner: ReplicaRunner = runner_for(
            plan,
            self._user_model,
            self._options,
            reducer=self._reducer,
            collectives=self._collectives,
            zero_grad=self._zero_grad if self._training else None,
        )

    # -- PopTorch's executor surface ----------------------------------------------------
    @property
    def model(self) -> nn.Module:
        """The user's module (it holds the current weights)."""
        return self._user_model

    @property
    def options(self) -> Options:
        """The options this model runs with (a copy of those given, output mode resolved)."""
        return self._options

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._user_model, name)

    def __repr__(self) -> str:
        kind = "trainingModel" if self._training else "inferenceModel"
        return f"{kind}({self._user_model!r})"

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Check a batch's shape against the options without running it."""
        self._check_alive()
        Batch(args, kwargs, self._options)
        self._compiled = True

    def destroy(self) -> None:
        """Release hooks and the device; the wrapped model can no longer be called."""
        if self._reducer is not None:
            self._reducer.remove()
        self._end_observation()
        self._destroyed = True
        self._attached = False

    def getOptimizer(self) -> torch.optim.Optimizer | None:
        """The optimizer the training model steps."""
        return self._optimizer

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Use ``optimizer``'s hyper-parameters (learning rate...) from the next call.

        The same optimizer object (changed by a scheduler) is already live.  Another
        optimizer of the same class and parameter grouping passes its hyper-parameters
        and keeps the current state, as on a device; any other replaces the optimizer.
        """
        self._check_alive()
        if not self._training:
            raise ExecutorError("setOptimizer is for a trainingModel")
        current = self._optimizer
        if optimizer is current:
            return
        assert current is not None
        same_layout = type(optimizer) is type(current) and [
            len(g["params"]) for g in optimizer.param_groups
        ] == [len(g["params"]) for g in current.param_groups]
        if same_layout:
            for new, old in zip(optimizer.param_groups, current.param_groups, strict=True):
                old.update({k: v for k, v in new.items() if k != "params"})
        else:
            self._optimizer = optimizer

    def _check_alive(self) -> None:
        if self._destroyed:
            raise ExecutorStateError("this model was destroyed; wrap the module again")

    @property
    def replica_runner(self) -> ReplicaRunner:
        """How the local replicas run (chosen when the model was wrapped)."""
        return self._runner

    # -- execution ----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._check_alive()
        if not self._attached:
            self._attached = True
        args, kwargs = self._inputs(args, kwargs)  # generated ones with synthetic data
        batch = Batch(args, kwargs, self._options, self._device)
        self._compiled = True
        model = self._user_model
        was_training = model.training
        if was_training != self._training:  # module.train() walks every submodule
            model.train(self._training)
        outer = progress.enter(sys._getframe(1))  # under poprun: what its collectives report
        started = time.monotonic()
        try:
            result = self._first_call(batch) if self._watch_blocks else self._run(batch)
            result = to_host(result) if self._to_host else result
        except BaseException:
            progress.leave(outer)
            raise
        finally:
            if was_training != self._training:
                model.train(was_training)
        progress.leave(outer, batch.samples, time.monotonic() - started)  # and a step done
        return result

    def _run(self, batch: Batch) -> Any:
        return (
            self._observed_run(batch, self._run_once) if self._observing else self._run_once(batch)
        )

    def _run_once(self, batch: Batch) -> Any:
        if self._training:
            return self._train(batch)
        with torch.no_grad():
            return self._infer(batch)

    def _first_call(self, batch: Batch) -> Any:
        """The first call of a model with no strategy: stage it if it places blocks.

        PopTorch runs a model whose ``Block`` contexts carry an ``ipu_id`` as
        ``PipelinedExecution(AutoStage.SameAsIpu)``; that shows only when forward runs, so
        the first forward is watched and, at the first placed ``Block``, abandoned (before
        any backward or optimizer step) and the call runs again through the stages.
        ``Block`` contexts without an ``ipu_id`` leave the model whole, with one warning.
        """
        from popdist_torch.pipeline import BlocksPlaced, check_accumulation, watch_blocks

        try:
            with watch_blocks() as seen:
                result = self._run(batch)
        except BlocksPlaced:
            self._facts = dataclasses.replace(self._facts, staged=True)
            plan = resolve(self._options, self._facts, self._world, training=self._training)
            self._watch_blocks = False
            if self._training:
                check_accumulation(None, self._options.Training.gradient_accumulation)
                self._zero_grad()
                if self._reducer is not None:
                    self._reducer.disarm()
            if plan.device != self._device:  # the stage runner places the stages themselves
                place(self._user_model, self._optimizer, plan.device)
                batch.batched = [t.to(plan.device) for t in batch.batched]
            self._adopt(plan)
            return self._run(batch)
        self._watch_blocks = False  # a call that failed is watched again next time
        if seen.unplaced_seen:
            warnings.warn(
                f"{type(self._user_model).__name__} has Block contexts without an ipu_id and "
                "no execution strategy, so it runs unstaged; to stage it give each Block an "
                "ipu_id or call opts.setExecutionStrategy(poptorch.PipelinedExecution(...))",
                UserWarning,
                stacklevel=3,
            )
        return result

    def _collector(self) -> OutputCollector:
        o = self._options
        return self._collector_for(
            o.output_mode,
            o.device_iterations,
            o.Training.gradient_accumulation,
            o.output_return_period,
        )

    def _zero_grad(self) -> None:
        assert self._optimizer is not None
        self._optimizer.zero_grad(set_to_none=True)

    def _train(self, batch: Batch) -> Any:
        opts, optimizer = self._options, self._optimizer
        assert optimizer is not None
        check_constants(optimizer)  # PopTorch's constant attributes: fixed from the first run
        mean = opts.Training.accumulation_and_replication_reduction_type == ReductionType.Mean
        scale = (
            1.0 / (batch.accumulation * (self._plan.mean_over or batch.replicas)) if mean else 1.0
        )
        # PopTorch's loss scaling: the backward pass carries the factor, the step removes it.
        loss_scaling = loss_scaling_of(optimizer)
        collector = self._collector()
        for d in self._timed(batch.iterations):
            optimizer.zero_grad(set_to_none=True)
            self._runner.forward_backward(batch, d, scale=scale * loss_scaling, collector=collector)
            if loss_scaling != 1.0:
                assert isinstance(optimizer, PopTorchOptimizer)
                optimizer.unscale_next_step(loss_scaling)
            if self._place_state:  # the stages are on their GPUs now
                move_optimizer_state(optimizer, lambda p: p.device)
                self._place_state = False
            with optimizer_state_on_device(optimizer, opts.TensorLocations.optimizer_on_chip):
                step(optimizer, self._shards)
            if self._anchors is not None:
                self._anchors.after_update(d)
        return collector.result()

    def _infer(self, batch: Batch) -> Any:
        collector = self._collector()
        for d in self._timed(batch.iterations):
            if collector.wants(d, 0):
                self._runner.forward(batch, d, collector)
            if self._anchors is not None:
                self._anchors.after_update(d)
        return collector.result()


def trainingModel(
    model: nn.Module, options: Options | None = None, optimizer: torch.optim.Optimizer | None = None
) -> PoplarExecutor:
    """Wrap ``model`` (whose forward returns its loss, or a tuple ending with it) for training.

    ``optimizer`` defaults to ``poptorch.optim.SGD(model.parameters(), lr=0.01)`` as in PopTorch
    (torch's SGD update, in float32 for a half-precision model).
    """
    return PoplarExecutor(model, options, training=True, optimizer=optimizer)


def inferenceModel(model: nn.Module, options: Options | None = None) -> PoplarExecutor:
    """Wrap ``model`` for inference (``gradientAccumulation`` must be 1; outputs ``All``)."""
    return PoplarExecutor(model, options, training=False)
