"""``trainingModel`` / ``inferenceModel``: PopTorch's data-parallel executor on torch.

One call takes a batch whose leading dimension is ``deviceIterations × gradientAccumulation
× localReplicas × micro-batch`` (PopART's host layout ``[device_iterations, accumulation,
replica, micro_batch, ...]``).  For each device iteration the executor runs, for each
accumulation step, every local replica's forward and backward on its micro-batch;
gradients accumulate in the parameters' ``.grad``; the cross-instance allreduce (Horovod,
fused, overlapped with the last backward) happens once per weight update; then the
optimizer steps.  The user's module is the model: it holds the current weights after
every call, and a training and an inference model of the same module share them.

Local replicas share one set of weights, so they do not need copies: the replicas of one
accumulation step run as one ``torch.func.vmap`` over a replica dimension (each replica
still sees only its micro-batch: per-replica losses, BatchNorm batch statistics and
dropout masks), which costs about what one forward/backward over the combined batch
costs.  Models that mutate buffers in training (BatchNorm running statistics) or that
``vmap`` cannot run (data-dependent Python control flow, ``.item()``) run the replicas
one after the other on the same module instead: same result, slower.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import vmap
from torch.utils._pytree import TreeSpec, tree_flatten, tree_map, tree_unflatten

from popdist_torch.enums import OutputMode, ReductionType
from popdist_torch.options import Options
from popdist_torch.outputs import OutputCollector
from popdist_torch.placement import CPU, instance_device, move_optimizer_state, place, to_host

__all__ = [
    "ExecutorError",
    "PoplarExecutor",
    "identity_loss",
    "inferenceModel",
    "trainingModel",
]

log = logging.getLogger(__name__)


class ExecutorError(ValueError):
    """A model, batch or option combination the executor cannot run."""


def identity_loss(x: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    """Mark ``x`` as the loss, reduced by ``"sum"``, ``"mean"`` or ``"none"`` (already scalar)."""
    if reduction == "sum":
        return x.sum()
    if reduction == "mean":
        return x.mean()
    if reduction == "none":
        return x
    raise ExecutorError(f"identity_loss(reduction={reduction!r}): expected 'sum', 'mean' or 'none'")


def _has_running_stats(model: nn.Module) -> bool:
    """Whether a training forward mutates buffers in place (BatchNorm running statistics)."""
    return any(
        isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats and m.training
        for m in model.modules()
    )


def _compute_threads() -> int | None:
    """Intra-op threads for one of several processes on a host: cores / local processes.

    ``None`` when the user chose (``OMP_NUM_THREADS``) or the run is a single process.
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    from popdist.env import read_run

    local = read_run().num_local_instances
    if local <= 1:
        return None
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    return max(1, cores // local)


class _Batch:
    """A call's inputs split into micro-batches: leaves shaped ``[DI, GA, R, b, ...]``."""

    def __init__(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: Options,
        device: torch.device = CPU,
    ) -> None:
        di, ga, r = (
            opts.device_iterations,
            opts.Training.gradient_accumulation,
            opts.replication_factor,
        )
        factor = di * ga * r
        # The common call, model(x, y): positional tensors only, no pytree walk to undo.
        self.spec: TreeSpec | None = None
        if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
            leaves, self.spec = tree_flatten((args, kwargs))
        else:
            leaves = list(args)
        self.constants: list[Any] = list(leaves)
        self.batched_index: list[int] = []
        self.batched: list[torch.Tensor] = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0:
                continue
            n = leaf.shape[0]
            if n % factor:
                raise ExecutorError(
                    f"Invalid batch dimension: In the input {self._name(i)}, the batch dimension "
                    f"({n}) must be a multiple of Options.deviceIterations({di}) * "
                    f"Options.replicationFactor({r}) * Options.Training.gradientAccumulation({ga}) "
                    f"= {factor} because it is used to calculate the batch size which will be "
                    f"executed on the device in any given iteration. For a full explanation see "
                    f"the batching semantics page of the documentation."
                )
            if leaf.device != device:
                leaf = leaf.to(device, non_blocking=True)
            self.batched_index.append(i)
            self.batched.append(leaf.reshape(di, ga, r, n // factor, *leaf.shape[1:]))
        if not self.batched:
            raise ExecutorError(
                "the model call has no tensor input with a batch dimension: pass at least one "
                "tensor whose leading dimension holds the samples"
            )

    def _name(self, index: int) -> str:
        if self.spec is None:
            return f"argument {index}"
        args, kwargs = tree_unflatten(list(range(len(self.constants))), self.spec)
        for pos, value in enumerate(args):
            if value == index:
                return f"argument {pos}"
        for key, value in kwargs.items():
            if value == index:
                return repr(key)
        return f"leaf {index}"

    def step(self, d: int, g: int) -> list[torch.Tensor]:
        """The inputs of accumulation step ``g`` of iteration ``d``: leaves ``[R, b, ...]``."""
        return [t[d, g] for t in self.batched]

    def rebuild(self, batched: Sequence[torch.Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        leaves = list(self.constants)
        for i, t in zip(self.batched_index, batched, strict=True):
            leaves[i] = t
        if self.spec is None:
            return tuple(leaves), {}
        args, kwargs = tree_unflatten(leaves, self.spec)
        return tuple(args), dict(kwargs)


def _loss_of(output: Any) -> torch.Tensor:
    """The loss: the output itself, or the last element of a tuple/list."""
    loss = output[-1] if isinstance(output, (tuple, list)) and output else output
    if not isinstance(loss, torch.Tensor):
        raise ExecutorError(
            f"a training model's forward must return its loss as a tensor, or a tuple whose "
            f"last element is the loss; got {type(loss).__name__}"
        )
    return loss


def _check_scalar(loss: torch.Tensor) -> None:
    if loss.dim() != 0:
        raise ExecutorError(
            f"the loss must be a scalar per micro-batch, got shape {tuple(loss.shape)}: reduce "
            f"it (loss.mean(), loss.sum()) or wrap it in identity_loss(x, reduction='mean')"
        )
    if not loss.requires_grad:
        raise ExecutorError(
            "the loss does not depend on any trainable parameter: check that forward() uses "
            "the module's parameters and that they have requires_grad=True"
        )


def _detach(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach()
    if type(tree) in (tuple, list) and all(isinstance(x, torch.Tensor) for x in tree):
        return type(tree)(x.detach() for x in tree)  # the common (output, loss): no pytree walk

    def one(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            raise ExecutorError(
                f"model outputs must be tensors (or tuples/lists/dicts of tensors); got "
                f"{type(x).__name__}"
            )
        return x.detach()

    return tree_map(one, tree)


def _stack(outputs: Sequence[Any]) -> Any:
    """Per-replica outputs → one pytree with a leading replica dimension."""
    flat = [tree_flatten(o) for o in outputs]
    columns = zip(*(leaves for leaves, _ in flat), strict=True)
    return tree_unflatten([torch.stack(c) for c in columns], flat[0][1])


class PoplarExecutor:
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
        opts = (options or Options()).clone()
        if opts.output_mode == OutputMode.Default:
            opts.outputMode(OutputMode.Final if training else OutputMode.All)
        if (
            opts.output_mode == OutputMode.EveryN
            and opts.device_iterations % opts.output_return_period
        ):
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
        self._user_model = model
        self._options = opts
        self._training = training
        self._attached = True
        self._destroyed = False
        self._fused: bool | None = None  # vmap over replicas: unknown until the first call
        if opts.Precision.autocast_enabled:
            # torch.autocast has no effect inside vmap: half precision runs replicas in turn.
            self._fused = False
        self._runner: Any = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._reducer: Any = None
        self._collectives: Any = None
        if training:
            self._optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.01)
        elif optimizer is not None:
            raise ExecutorError("inferenceModel takes no optimizer; use trainingModel to train")
        self._setup_strategy()
        # The instance's GPU when it has one; before the broadcast, which then runs there.
        self._device = instance_device(pipelined=self._runner is not None)
        place(model, self._optimizer, self._device)
        dist = opts.Distributed
        if dist.numProcesses > 1:
            threads = _compute_threads()
            if threads is not None:
                torch.set_num_threads(threads)
            from popdist_torch.collectives import GradientReducer, broadcast_state, connect

            self._collectives = connect(dist.numProcesses, dist.processId)
            broadcast_state(
                self._collectives, model, self._optimizer, buffers=opts.broadcast_buffers
            )
            if training:
                average = (
                    opts.Training.accumulation_and_replication_reduction_type == ReductionType.Mean
                )
                self._reducer = GradientReducer(
                    self._collectives, model.named_parameters(), average=average
                )

    # -- model-parallel strategies ------------------------------------------------------
    def _setup_strategy(self) -> None:
        from popdist_torch.pipeline import StageRunner, check_accumulation, has_block_annotations

        strategy = self._options.execution_strategy
        if strategy is None and not has_block_annotations(self._user_model):
            return
        if self._training:
            check_accumulation(strategy, self._options.Training.gradient_accumulation)
        # Under poprun: --ipus-per-replica; otherwise (None) as many devices as the stages
        # name, which the runner learns when it splits the model (auto-staging included).
        devices = getattr(self._options, "ipus_per_replica", None)
        self._runner = StageRunner(self._user_model, strategy, num_devices=devices)

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

    def isAttachedToDevice(self) -> bool:
        """Whether the model holds its device (PopTorch reattaches on the next call)."""
        return self._attached

    def detachFromDevice(self) -> None:
        """Release the device; the next call reattaches."""
        self._check_alive()
        if not self._attached:
            raise RuntimeError("detachFromDevice: the model is not attached to a device")
        self._attached = False

    def attachToDevice(self) -> None:
        """Take the device back after ``detachFromDevice``."""
        self._check_alive()
        if self._attached:
            raise RuntimeError("attachToDevice: the model is already attached to a device")
        self._attached = True

    def copyWeightsToHost(self) -> None:
        """Nothing to copy: the user's module holds the weights after every call."""
        self._check_alive()

    def copyWeightsToDevice(self) -> None:
        """Nothing to copy: calls read the user's module's weights directly."""
        self._check_alive()

    def isCompiled(self) -> bool:
        """True: eager execution needs no compilation."""
        return True

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """Check a batch's shape against the options without running it."""
        self._check_alive()
        _Batch(args, kwargs, self._options)

    def destroy(self) -> None:
        """Release hooks and the device; the wrapped model can no longer be called."""
        if self._reducer is not None:
            self._reducer.remove()
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
            raise RuntimeError("this model was destroyed; wrap the module again")

    # -- execution ----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._check_alive()
        if not self._attached:
            self._attached = True
        batch = _Batch(args, kwargs, self._options, self._device)
        model = self._user_model
        was_training = model.training
        if was_training != self._training:  # module.train() walks every submodule
            model.train(self._training)
        try:
            if self._training:
                result = self._train(batch)
            else:
                with torch.no_grad():
                    result = self._infer(batch)
            return result if self._device == CPU else to_host(result)
        finally:
            if was_training != self._training:
                model.train(was_training)

    def _collector(self) -> OutputCollector:
        o = self._options
        return OutputCollector(
            o.output_mode,
            o.device_iterations,
            o.Training.gradient_accumulation,
            o.output_return_period,
        )

    def _train(self, batch: _Batch) -> Any:
        opts, optimizer = self._options, self._optimizer
        assert optimizer is not None
        di, ga, r = (
            opts.device_iterations,
            opts.Training.gradient_accumulation,
            opts.replication_factor,
        )
        mean = opts.Training.accumulation_and_replication_reduction_type == ReductionType.Mean
        scale = 1.0 / (ga * r) if mean else 1.0
        collector = self._collector()
        for d in range(di):
            optimizer.zero_grad(set_to_none=True)
            if self._runner is not None:
                self._run_stages(batch, d, scale, collector)
            else:
                for g in range(ga):
                    last = g == ga - 1
                    keep = collector.wants(d, g)
                    outputs = self._replicas_backward(batch.step(d, g), batch, scale, last, keep)
                    if keep:
                        collector.add(d, g, outputs)
            if self._reducer is not None:
                self._reducer.finish()
            with self._optimizer_state_on_device():
                optimizer.step()
        return collector.result()

    def _arm(self, last: bool) -> None:
        if last and self._reducer is not None:
            self._reducer.arm()

    def _replicas_backward(
        self, inputs: list[torch.Tensor], batch: _Batch, scale: float, last: bool, keep: bool
    ) -> Any:
        """Forward and backward of every local replica of one accumulation step.

        Returns the replicas' detached outputs when ``keep`` (the output mode wants them).
        """
        r = inputs[0].shape[0]
        if r > 1 and self._fused is not False:
            if self._fused is None and _has_running_stats(self._user_model):
                self._fused = False
            else:
                try:
                    self._arm(last)
                    outputs, losses = self._vmap_forward(inputs, batch, training=True)
                    if not losses.requires_grad:
                        _check_scalar(losses[0])
                    # d(scale * sum(losses)) / d(losses) = scale, without the two extra ops
                    losses.backward(torch.full_like(losses, scale))
                    self._fused = True
                    return _detach(outputs) if keep else None
                except ExecutorError:
                    raise
                except Exception as exc:  # vmap cannot run this model: replicas in turn
                    if self._fused:
                        raise
                    self._fused = False
                    self._optimizer_zero_grad_for_retry()
                    log.info("replicas run one after the other (vmap: %s)", exc)
        outputs = []
        for i in range(r):
            args, kwargs = batch.rebuild([t[i] for t in inputs])
            with self._autocast():
                out = self._user_model(*args, **kwargs)
            loss = _loss_of(out)
            _check_scalar(loss)
            self._arm(last and i == r - 1)
            (loss * scale).backward()
            if keep:
                outputs.append(_detach(out))
        return _stack(outputs) if keep else None

    def _optimizer_zero_grad_for_retry(self) -> None:
        # A failed vmap attempt happens at the very first accumulation step of a call's
        # first iteration, before any gradient of this update was kept: start it again.
        assert self._optimizer is not None
        self._optimizer.zero_grad(set_to_none=True)
        if self._reducer is not None:
            self._reducer.disarm()

    def _vmap_forward(
        self, inputs: list[torch.Tensor], batch: _Batch, *, training: bool
    ) -> tuple[Any, torch.Tensor]:
        model = self._user_model

        # The parameters enter unbatched, as the module's own tensors (no functional_call
        # swapping them in and out on every call): autograd reaches them through the
        # vmapped graph, so their .grad and hooks see the sum over replicas.
        def one_replica(tensors: list[torch.Tensor]) -> Any:
            args, kwargs = batch.rebuild(tensors)
            out = model(*args, **kwargs)
            if training:
                loss = _loss_of(out)
                if loss.dim() != 0:
                    raise ExecutorError(
                        f"the loss must be a scalar per micro-batch, got shape "
                        f"{tuple(loss.shape)}: reduce it (loss.mean(), loss.sum()) or wrap it "
                        f"in identity_loss(x, reduction='mean')"
                    )
            return out

        out = vmap(one_replica, randomness="different")(inputs)
        losses = _loss_of(out) if training else torch.empty(0)
        return out, losses

    def _run_stages(self, batch: _Batch, d: int, scale: float, collector: OutputCollector) -> None:
        """Model-parallel replicas: each replica's accumulation steps through the stages."""
        opts = self._options
        ga, r = opts.Training.gradient_accumulation, opts.replication_factor
        per_replica: list[list[Any]] = []
        for i in range(r):
            micro = [list(batch.rebuild([t[i] for t in batch.step(d, g)])[0]) for g in range(ga)]
            per_replica.append(self._runner.forward_backward(micro, grad_scale=scale))
        if self._reducer is not None:
            self._reducer.reduce_all()
        for g in range(ga):
            collector.add(d, g, _stack([_detach(per_replica[i][g]) for i in range(r)]))

    def _infer(self, batch: _Batch) -> Any:
        opts = self._options
        di, r = opts.device_iterations, opts.replication_factor
        collector = self._collector()
        for d in range(di):
            if not collector.wants(d, 0):
                continue
            inputs = batch.step(d, 0)
            if self._runner is not None:
                micro = [list(batch.rebuild([t[i] for t in inputs])[0]) for i in range(r)]
                collector.add(d, 0, _stack([_detach(o) for o in self._runner.forward(micro)]))
                continue
            collector.add(d, 0, self._replicas_forward(inputs, batch))
        return collector.result()

    def _replicas_forward(self, inputs: list[torch.Tensor], batch: _Batch) -> Any:
        r = inputs[0].shape[0]
        if r > 1 and self._fused is not False:
            try:
                out, _ = self._vmap_forward(inputs, batch, training=False)
                self._fused = True
                return _detach(out)
            except ExecutorError:
                raise
            except Exception as exc:
                if self._fused:
                    raise
                self._fused = False
                log.info("replicas run one after the other (vmap: %s)", exc)
        outputs = []
        for i in range(r):
            args, kwargs = batch.rebuild([t[i] for t in inputs])
            with self._autocast():
                outputs.append(_detach(self._user_model(*args, **kwargs)))
        return _stack(outputs)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.autocast`` on the instance's device when ``Precision.autocastEnabled``."""
        precision = self._options.Precision
        if not precision.autocast_enabled:
            return contextlib.nullcontext()
        dtype = getattr(torch, precision.autocast_dtype)
        return torch.autocast(device_type=self._device.type, dtype=dtype)

    @contextlib.contextmanager
    def _optimizer_state_on_device(self) -> Iterator[None]:
        """Optimizer state in host memory between updates when the options ask for it."""
        optimizer = self._optimizer
        assert optimizer is not None
        if self._options.TensorLocations.optimizer_on_chip:
            yield
            return
        move_optimizer_state(optimizer, lambda p: p.device)
        try:
            yield
        finally:
            move_optimizer_state(optimizer, lambda p: CPU)


def trainingModel(
    model: nn.Module, options: Options | None = None, optimizer: torch.optim.Optimizer | None = None
) -> PoplarExecutor:
    """Wrap ``model`` (whose forward returns its loss, or a tuple ending with it) for training.

    ``optimizer`` defaults to ``torch.optim.SGD(model.parameters(), lr=0.01)`` as in PopTorch.
    """
    return PoplarExecutor(model, options, training=True, optimizer=optimizer)


def inferenceModel(model: nn.Module, options: Options | None = None) -> PoplarExecutor:
    """Wrap ``model`` for inference (``gradientAccumulation`` must be 1; outputs ``All``)."""
    return PoplarExecutor(model, options, training=False)
