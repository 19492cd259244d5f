"""The executors IPUStrategy runs the LightningModule's step methods with, one per step name.

``training_step`` runs in a ``trainingModel`` (with the optimizer from
``configure_optimizers``), the others in an ``inferenceModel``, each built on the step's
first call around a wrapper module (``step.py``), and kept until the options change.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils._pytree import tree_flatten

import popdist_torch as poptorch
from popdist_lightning.errors import IPUStrategyError
from popdist_lightning.strategy.options import SHARDED_NOTE
from popdist_lightning.strategy.report import AutoReport
from popdist_lightning.strategy.step import FlatStepModule, StepModule, flat_step_module
from popdist_torch.pipeline import PipelineError, ShardedExecution

__all__ = ["StepExecutors"]


def _flat_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a step call is ``(batch, batch_idx)`` with a batch made of tensors."""
    if kwargs or len(args) != 2 or not isinstance(args[1], int):
        return False
    leaves = tree_flatten(args[0])[0]
    return bool(leaves) and all(isinstance(leaf, torch.Tensor) for leaf in leaves)


class StepExecutors:
    """Build, run and release the executors of one strategy's step methods."""

    def __init__(self) -> None:
        self.training_opts: poptorch.Options | None = None
        self.inference_opts: poptorch.Options | None = None
        self.pipelined = False
        #: Set by ``IPUStrategy(autoreport=True)``: times every call, collects its schedule.
        self.report: AutoReport | None = None
        self._executors: dict[str, poptorch.PoplarExecutor] = {}
        self._steps: dict[str, StepModule] = {}

    def configure(
        self, training: poptorch.Options, inference: poptorch.Options, pipelined: bool
    ) -> None:
        """New options (a new stage of the Trainer): the old executors are released."""
        self.release()
        self.training_opts, self.inference_opts, self.pipelined = training, inference, pipelined

    def _build(
        self, module: Any, optimizer: Any, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        wrapper = (
            flat_step_module(module, step, args[0])
            if _flat_call(args, kwargs)
            else StepModule(module, step)
        )
        if self.pipelined and not isinstance(wrapper, FlatStepModule):
            raise IPUStrategyError(
                f"a pipelined LightningModule's {step} takes (batch, batch_idx) with a "
                f"batch made of tensors under IPUStrategy (one dataloader)"
            )
        if step == "training_step":
            executor = poptorch.trainingModel(wrapper, self.training_opts, optimizer=optimizer)
        else:
            executor = poptorch.inferenceModel(wrapper, self.inference_opts)
        self._executors[step], self._steps[step] = executor, wrapper

    def _call(
        self, module: Any, optimizer: Any, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if step not in self._executors:
            self._build(module, optimizer, step, args, kwargs)
        executor, wrapper = self._executors[step], self._steps[step]
        if isinstance(wrapper, FlatStepModule):
            return executor(*wrapper.inputs(args[0]), torch.tensor(args[1]))
        return executor(*args, **kwargs)

    def run(
        self, module: Any, optimizer: Any, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run ``module``'s ``step`` through its executor; log what it logged; its result."""
        with self.report.call(step) if self.report is not None else contextlib.nullcontext():
            outputs = self._run_call(module, optimizer, step, args, kwargs)
        wrapper = self._steps[step]
        values, result = wrapper.split(outputs)
        for (name, log_kwargs), value in zip(wrapper.calls, values, strict=True):
            module.log(name, value.float().mean(), **log_kwargs)
        return result

    def _run_call(
        self, module: Any, optimizer: Any, step: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        try:
            return self._call(module, optimizer, step, args, kwargs)
        except PipelineError:
            # Block(ipu_id=...) contexts found on the first call staged the model as a
            # pipeline, which one micro-batch per update cannot fill: shard it instead.
            opts = self.training_opts
            assert opts is not None
            if (
                step != "training_step"
                or opts.execution_strategy is not None
                or opts.Training.gradient_accumulation != 1
            ):
                raise
            rank_zero_info(SHARDED_NOTE)
            opts.setExecutionStrategy(ShardedExecution())
            self._executors.pop(step).destroy()
            return self._call(module, optimizer, step, args, kwargs)

    def release(self) -> None:
        """Destroy every executor (their gradient hooks) and forget the wrappers."""
        for executor in self._executors.values():
            executor.destroy()
        self._executors.clear()
        self._steps.clear()
