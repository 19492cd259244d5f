"""``trainingModel`` / ``inferenceModel``: PopTorch's data-parallel executor on torch.

One call takes a batch whose leading dimension is ``deviceIterations × gradientAccumulation
× localReplicas × micro-batch`` (PopART's host layout ``[device_iterations, accumulation,
replica, micro_batch, ...]``, :class:`~popdist_torch.execution.batch.Batch`).  For each device
iteration the executor's *replica runner* (:mod:`popdist_torch.execution.runners`, chosen once when
the model is wrapped) runs, for each accumulation step, every local replica's forward and
backward on its micro-batch; gradients accumulate in the parameters' ``.grad``; the
cross-instance allreduce (:mod:`popdist_torch.execution.reducer`, fused, overlapped with the last
backward) happens once per weight update; then the optimizer steps.  The user's module is
the model: it holds the current weights after every call, and a training and an inference
model of the same module share them.
"""

from __future__ import annotations

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
from popdist_torch.execution.deterministic import DeterministicReplicaRunner, ReplicaGradients
from popdist_torch.execution.device import DeviceSide
from popdist_torch.execution.observation import Observation
from popdist_torch.execution.outputs import OutputCollector
from popdist_torch.execution.placement import (
    CPU,
    instance_device,
    optimizer_state_on_device,
    place,
    to_host,
)
from popdist_torch.execution.reducer import GradientReducer, broadcast_state, connect
from popdist_torch.execution.runners import ReplicaRunner, make_runner, uses_stages
from popdist_torch.optim import SGD, PopTorchOptimizer, check_constants, loss_scaling_of
from popdist_torch.optim.sharded import StateShards, step
from popdist_torch.options import Options
from popdist_torch.options.distributed import replica_counts
from popdist_torch.surface.loss import mark_loss

__all__ = [
    "ExecutorError",
    "PoplarExecutor",
    "identity_loss",
    "inferenceModel",
    "trainingModel",
]


_NO_DETERMINISTIC_STAGES = (
    "Training.deterministicReduction (or poprun --deterministic-reduction) runs whole "
    "replicas one by one; a model split into stages cannot use it: turn it off, or run "
    "the model unstaged"
)


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
    model: nn.Module,
    opts: Options,
    optimizer: torch.optim.Optimizer | None,
    *,
    average: bool,
    deterministic: bool,
) -> tuple[Collectives | None, GradientReducer | None]:
    """Join the other instances: start from instance 0's state; a training model's reducer.

    The collectives are ``None`` when they connect no other process (one process: the local
    backend). The reducer is ``None`` then, for an inference model, and with the
    deterministic reduction (which reduces in its own runner).
    """
    dist = opts.Distributed
    collectives = connect(dist.numProcesses, dist.processId)
    communicates = collectives.capabilities.communicates
    threads = read_compute_threads(deterministic=deterministic)
    if threads is not None and (communicates or deterministic):
        torch.set_num_threads(threads)
    if not communicates:
        return None, None
    broadcast_state(collectives, model, optimizer, buffers=opts.broadcast_buffers)
    if optimizer is None or deterministic:
        return collectives, None
    return collectives, GradientReducer(collectives, model.named_parameters(), average=average)


def _join(
    model: nn.Module, opts: Options, optimizer: torch.optim.Optimizer | None, training: bool
) -> tuple[
    int | None, Collectives | None, GradientReducer | None, DeterministicReplicaRunner | None
]:
    """Join the other instances and choose how gradients are reduced.

    Returns the replicas a Mean divides by (``None``: this instance's, the uniform default
    path), the collectives (``None``: no other instance), the default reducer, and the
    deterministic reduction's runner (or ``None``). A mean over
    all replicas weighs each one alike: with a non-uniform split (or the deterministic
    reduction) each loss is scaled by 1 / all replicas, and the instances' sums are added.
    """
    dist = opts.Distributed
    counts = replica_counts(dist.numProcesses, dist.processId, opts.replication_factor)
    deterministic = training and opts.Training.deterministic_reduction
    mean = opts.Training.accumulation_and_replication_reduction_type == ReductionType.Mean
    uniform = len(set(counts)) == 1
    collectives, reducer = _connect(
        model, opts, optimizer, average=mean and uniform, deterministic=deterministic
    )
    runner = None
    if deterministic:
        if uses_stages(model, opts):
            raise ExecutorError(_NO_DETERMINISTIC_STAGES)
        rows = ReplicaGradients(collectives, model.named_parameters(), counts, dist.processId)
        runner = DeterministicReplicaRunner(model, rows)
    return (None if uniform and not deterministic else sum(counts)), collectives, reducer, runner


def _refuse_stages(runner: ReplicaRunner) -> None:
    """The deterministic reduction runs whole replicas: a model found to place blocks fails."""
    if isinstance(runner, DeterministicReplicaRunner):
        raise ExecutorError(_NO_DETERMINISTIC_STAGES)


def _shards(opts: Options, collectives: Collectives | None) -> StateShards | None:
    """The optimizer-state shards when the options shard it and there are other instances
    (``collectives``: ``None`` without them, or without an optimizer)."""
    locations = opts.TensorLocations
    if collectives is None or not locations.optimizer_sharded:
        return None
    return StateShards(collectives, locations.sharding_min_elements)


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
        self._optimizer: torch.optim.Optimizer | None = None
        if training:
            self._optimizer = optimizer or SGD(model.parameters(), lr=0.01)
            if uses_stages(model, opts):
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
        # The instance's GPU when it has one; before the broadcast, which then runs there.
        self._device = instance_device(
            pipelined=uses_stages(model, opts), num_processes=opts.Distributed.numProcesses
        )
        place(model, self._optimizer, self._device)
        joined = _join(model, opts, self._optimizer, training)
        self._mean_over, collectives, self._reducer, deterministic = joined
        self._shards = _shards(opts, collectives if self._optimizer is not None else None)
        # ``Block`` contexts show only when forward runs: the first call watches for them.
        self._watch_blocks = not uses_stages(model, opts)
        self._runner: ReplicaRunner = deterministic or make_runner(
            model,
            opts,
            reducer=self._reducer,
            zero_grad=self._zero_grad if training else None,
            device_type=self._device.type,
        )
        self._observe(self._device)

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
            result = result if self._device == CPU else to_host(result)
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
            _refuse_stages(self._runner)
            self._watch_blocks = False
            if self._training:
                check_accumulation(None, self._options.Training.gradient_accumulation)
                self._zero_grad()
                if self._reducer is not None:
                    self._reducer.disarm()
            if self._device != CPU:  # the stage runner places the stages itself
                self._device = CPU
                place(self._user_model, self._optimizer, CPU)
                batch.batched = [t.to(CPU) for t in batch.batched]
            self._runner = make_runner(
                self._user_model,
                self._options,
                reducer=self._reducer,
                zero_grad=self._zero_grad if self._training else None,
                staged=True,
            )
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
        scale = 1.0 / (batch.accumulation * (self._mean_over or batch.replicas)) if mean else 1.0
        # PopTorch's loss scaling: the backward pass carries the factor, the step removes it.
        loss_scaling = loss_scaling_of(optimizer)
        collector = self._collector()
        for d in self._timed(batch.iterations):
            optimizer.zero_grad(set_to_none=True)
            self._runner.forward_backward(batch, d, scale=scale * loss_scaling, collector=collector)
            if loss_scaling != 1.0:
                assert isinstance(optimizer, PopTorchOptimizer)
                optimizer.unscale_next_step(loss_scaling)
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
