"""Replica runners: how one device iteration's local replicas run, chosen once per model.

A :class:`ReplicaRunner` runs, for one device iteration, every accumulation step of every
local replica: :meth:`~ReplicaRunner.forward_backward` (training: gradients summed into
``.grad``, then reduced across instances) or :meth:`~ReplicaRunner.forward` (inference).
The executor's plan names one when the model is wrapped, and
:func:`popdist_torch.execution.setup.build.runner_for` builds it (through :func:`make_runner`
for these two; the deterministic reduction has its own):

- :class:`LocalReplicaRunner`: the whole model per replica. Local replicas share one set of
  weights, so the replicas of one accumulation step run as one ``torch.func.vmap`` over a
  replica dimension (each replica still sees only its micro-batch: per-replica losses,
  BatchNorm batch statistics and dropout masks), which costs about what one pass over the
  combined batch costs. Models that mutate buffers in training (BatchNorm running
  statistics) or that ``vmap`` cannot run (data-dependent Python control flow,
  ``.item()``) run the replicas one after the other on the same module: same result,
  slower. The choice is made on the first call and kept. With
  ``Precision.autocastEnabled`` each forward runs under ``torch.autocast``, which has no
  effect inside ``vmap``: the replicas then run one after the other.
  On a GPU the fused training micro-step is captured in a graph and replayed
  (:mod:`popdist_torch.execution.capture`) when the plan and the first calls allow it.
- :class:`StageReplicaRunner`: each replica split into stages over its devices
  (:class:`popdist_torch.pipeline.StageRunner`), for models with an execution strategy or
  block annotations.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.func import vmap

from popdist_torch.errors import ExecutorError
from popdist_torch.execution.batch import Batch, detach, detach_own, stack
from popdist_torch.execution.capture.eligibility import StepFacts
from popdist_torch.execution.capture.graphed import NOT_RUN, GraphedSteps
from popdist_torch.execution.outputs import OneReplica, OutputCollector
from popdist_torch.execution.reducer import GradientReducer
from popdist_torch.options import Options
from popdist_torch.surface.loss import (
    Path,
    backward_loss,
    find_loss,
    loss_at,
    loss_path,
    marked_path,
    watching_losses,
)

__all__ = ["LocalReplicaRunner", "ReplicaRunner", "StageReplicaRunner", "make_runner"]

log = logging.getLogger("popdist_torch.execution.executor")


class ReplicaRunner(abc.ABC):
    """Runs the local replicas of one device iteration; ``reducer`` reduces across instances."""

    def __init__(self, model: nn.Module, reducer: GradientReducer | None) -> None:
        self.model = model
        self.reducer = reducer

    @abc.abstractmethod
    def forward_backward(
        self, batch: Batch, iteration: int, *, scale: float, collector: OutputCollector
    ) -> None:
        """Forward and backward of every replica and accumulation step of ``iteration``.

        Each micro-batch's loss, times ``scale``, is back-propagated; the gradients sum in
        ``.grad`` and are reduced across instances before this returns. The outputs the
        ``collector`` wants are added to it (leaves ``[R, ...]``, detached).
        """

    @abc.abstractmethod
    def forward(self, batch: Batch, iteration: int, collector: OutputCollector) -> None:
        """Every replica's forward of ``iteration`` (inference); outputs go to ``collector``."""


class LocalReplicaRunner(ReplicaRunner):
    """The whole model per replica: fused by ``vmap`` when it can, else replica by replica."""

    def __init__(
        self,
        model: nn.Module,
        reducer: GradientReducer | None,
        zero_grad: Callable[[], None] | None = None,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        graphs: GraphedSteps | None = None,
    ) -> None:
        super().__init__(model, reducer)
        self._zero_grad = zero_grad  # the optimizer's, to start an update again
        self._fused: bool | None = None  # unknown until the first call with replicas > 1
        self._autocast = autocast or contextlib.nullcontext
        self._graphs = graphs  # the captured training micro-step, when the plan allows it
        if autocast is not None:
            self._fused = False  # torch.autocast has no effect inside vmap

    def run_in_turn(self) -> None:
        """Run the replicas one after the other from now on (hooks that must see each one)."""
        self._in_turn("a hook must see each replica")

    def _in_turn(self, reason: str) -> None:
        self._fused = False
        if self._graphs is not None:
            self._graphs.refuse(StepFacts(in_turn=reason))
            self._graphs = None

    @property
    def graphs(self) -> GraphedSteps | None:
        """The captured micro-step's state (``None``: every step runs eagerly)."""
        return self._graphs

    @property
    def fused(self) -> bool | None:
        """Whether replicas run as one ``vmap`` (``None`` until a call has decided)."""
        return self._fused

    def forward_backward(
        self, batch: Batch, iteration: int, *, scale: float, collector: OutputCollector
    ) -> None:
        graphs = self._graphs
        if graphs is not None:
            if iteration == 0:
                graphs.begin_call(batch, fused=self._fused is True)
            if graphs.replaying:
                graphs.begin_update()
        steps = batch.accumulation
        for g in range(steps):
            keep = collector.wants(iteration, g)
            inputs = batch.step(iteration, g)
            outputs = NOT_RUN
            if graphs is not None and graphs.replaying:
                outputs = graphs.step(inputs, scale, keep, self._captured_step(batch))
            if outputs is NOT_RUN:
                outputs = self._replicas(inputs, batch, scale=scale, last=g == steps - 1, keep=keep)
            if keep:
                collector.add(iteration, g, outputs)
        if graphs is not None:
            graphs.end_update()
            if graphs.off is not None:
                self._graphs = None
        if self.reducer is not None:
            self.reducer.finish()

    def _captured_step(self, batch: Batch) -> Callable[[list[torch.Tensor], torch.Tensor], Any]:
        """The fused step a graph captures: static inputs, the scale a device tensor."""

        def run(inputs: list[torch.Tensor], scale: torch.Tensor) -> Any:
            return self._fused_step(inputs, batch, scale=scale, last=True, keep=True)

        return run

    def forward(self, batch: Batch, iteration: int, collector: OutputCollector) -> None:
        outputs = self._replicas(batch.step(iteration, 0), batch, scale=None, last=False, keep=True)
        collector.add(iteration, 0, outputs)

    def _replicas(
        self,
        inputs: list[torch.Tensor],
        batch: Batch,
        *,
        scale: float | None,
        last: bool,
        keep: bool,
    ) -> Any:
        """One accumulation step of every replica (``scale`` None: inference).

        Returns the replicas' detached outputs when ``keep``, else ``None``.
        """
        if inputs[0].shape[0] > 1 and self._may_fuse(training=scale is not None):
            graphs = self._graphs
            try:
                if graphs is None:
                    outputs = self._fused_step(inputs, batch, scale=scale, last=last, keep=keep)
                else:  # a warm-up step before a capture (or an eager call)
                    with graphs.warming():
                        outputs = self._fused_step(inputs, batch, scale=scale, last=last, keep=keep)
                self._fused = True
                return outputs
            except ExecutorError:
                raise
            except Exception as exc:  # vmap cannot run this model: replicas in turn
                if self._fused:
                    raise
                self._in_turn(f"vmap: {exc}")
                if scale is not None:
                    self._restart_update()
                log.info("replicas run one after the other (vmap: %s)", exc)
        return self._one_by_one(inputs, batch, scale=scale, last=last, keep=keep)

    def _may_fuse(self, *, training: bool) -> bool:
        if self._fused is None and training and _has_running_stats(self.model):
            self._in_turn("BatchNorm updates its running statistics")
        return self._fused is not False

    def _arm(self, last: bool) -> None:
        if last and self.reducer is not None:
            self.reducer.arm()

    def _restart_update(self) -> None:
        # A failed vmap attempt happens at the very first accumulation step of a call's
        # first iteration, before any gradient of this update was kept: start it again.
        if self._zero_grad is not None:
            self._zero_grad()
        if self.reducer is not None:
            self.reducer.disarm()

    def _fused_step(
        self,
        inputs: list[torch.Tensor],
        batch: Batch,
        *,
        scale: float | torch.Tensor | None,
        last: bool,
        keep: bool,
    ) -> Any:
        model = self.model

        # The parameters enter unbatched, as the module's own tensors (no functional_call
        # swapping them in and out on every call): autograd reaches them through the
        # vmapped graph, so their .grad and hooks see the sum over replicas.
        marked: list[Path | None] = [None]

        def one_replica(tensors: list[torch.Tensor]) -> Any:
            args, kwargs = batch.rebuild(tensors)
            if scale is None:
                return model(*args, **kwargs)
            with watching_losses() as marks:  # identity_loss's mark is seen inside vmap only
                output = model(*args, **kwargs)
            if marks:
                marked[0] = marked_path(output, lambda v: any(v is m for m in marks), ExecutorError)
            return output

        if scale is not None:
            self._arm(last)
        out = vmap(one_replica, randomness="different")(inputs)
        if scale is not None:
            path, is_marked = (
                (marked[0], True) if marked[0] is not None else loss_path(out, replicas=True)
            )
            losses = loss_at(out, path, is_marked, replicas=True)
            # d(scale * sum(losses)) / d(losses) = scale, without the two extra ops; a
            # captured step reads the scale from a device tensor: the same values
            if isinstance(scale, torch.Tensor):
                seed = scale.to(losses.dtype).expand(losses.shape).contiguous()
            else:
                seed = torch.full_like(losses, scale)
            losses.backward(seed)  # type: ignore[no-untyped-call]
        return detach_own(out) if keep else None  # laid out later, after the update

    def _one_by_one(
        self,
        inputs: list[torch.Tensor],
        batch: Batch,
        *,
        scale: float | None,
        last: bool,
        keep: bool,
    ) -> Any:
        outputs = []
        replicas = inputs[0].shape[0]
        for i in range(replicas):
            args, kwargs = batch.rebuild([t[i] for t in inputs])
            with self._autocast(), watching_losses() as marks:
                out = self.model(*args, **kwargs)
            if scale is not None:
                loss = find_loss(out, marks)
                self._arm(last and i == replicas - 1)
                backward_loss(loss, scale)
            if keep:
                outputs.append(detach_own(out) if replicas == 1 else detach(out))
        if not keep:
            return None
        return OneReplica(outputs[0]) if replicas == 1 else stack(outputs)


class StageReplicaRunner(ReplicaRunner):
    """Each replica split into stages over its devices, one replica after the other."""

    def __init__(self, model: nn.Module, reducer: GradientReducer | None, stages: Any) -> None:
        super().__init__(model, reducer)
        self.stages = stages  # a popdist_torch.pipeline.StageRunner

    def forward_backward(
        self, batch: Batch, iteration: int, *, scale: float, collector: OutputCollector
    ) -> None:
        from popdist_torch.pipeline import MicroBatch

        steps, replicas = batch.accumulation, batch.replicas
        per_replica = [
            self.stages.forward_backward(
                [MicroBatch(*batch.replica_call(iteration, g, i)) for g in range(steps)],
                grad_scale=scale,
            )
            for i in range(replicas)
        ]
        if self.reducer is not None:
            # Stage threads fire the gradient hooks out of order: reduce everything now.
            self.reducer.reduce_all()
        for g in range(steps):
            collector.add(iteration, g, stack([detach(per_replica[i][g]) for i in range(replicas)]))

    def forward(self, batch: Batch, iteration: int, collector: OutputCollector) -> None:
        from popdist_torch.pipeline import MicroBatch

        micro = [MicroBatch(*batch.replica_call(iteration, 0, i)) for i in range(batch.replicas)]
        collector.add(iteration, 0, stack([detach(o) for o in self.stages.forward(micro)]))


def _has_running_stats(model: nn.Module) -> bool:
    """Whether a training forward mutates buffers in place (BatchNorm running statistics)."""
    return any(
        isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats and m.training
        for m in model.modules()
    )


def make_runner(
    model: nn.Module,
    options: Options,
    *,
    reducer: GradientReducer | None,
    zero_grad: Callable[[], None] | None = None,
    staged: bool = False,
    device_type: str = "cpu",
    graphs: GraphedSteps | None = None,
    stage_gpus: int | None = None,
) -> ReplicaRunner:
    """The runner for ``model`` under ``options``; ``zero_grad`` restarts an update.

    ``staged``: the plan's runner is ``"staged"`` (an execution strategy, block annotations,
    or ``Block`` contexts placed at the first forward), else the local replicas' runner.
    ``device_type`` is where the replicas compute (``torch.autocast``'s device);
    ``graphs`` captures the local replicas' fused training step; ``stage_gpus`` is how many
    GPUs the stages may use (``None``: every GPU the process sees).
    """
    if not staged:
        autocast = None
        precision = options.Precision
        if precision.autocast_enabled:
            dtype = getattr(torch, precision.autocast_dtype)

            def autocast() -> contextlib.AbstractContextManager[Any]:
                return torch.autocast(device_type=device_type, dtype=dtype)

        return LocalReplicaRunner(model, reducer, zero_grad, autocast, graphs)
    from popdist_torch.pipeline import StageRunner

    # Under poprun: --ipus-per-replica; otherwise (None) as many devices as the stages
    # name, which the runner learns when it splits the model (auto-staging included).
    stages = StageRunner(
        model, options.execution_strategy, num_devices=options.ipus_per_replica, gpus=stage_gpus
    )
    return StageReplicaRunner(model, reducer, stages)
