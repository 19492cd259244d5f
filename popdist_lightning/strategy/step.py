"""The module the executor runs: one of the LightningModule's step methods, ``self.log`` captured.

popdist_torch's executor calls a module once per replica and micro-batch (under ``vmap``
for the local replicas), so ``self.log`` cannot reach Lightning's result collection
from inside a step: a logged value there is one replica's, and under ``vmap`` a batched
tensor. The step module records each ``self.log`` call instead and returns the logged
values as extra outputs; the strategy then logs their mean over the returned replicas
and micro-batches through the real ``self.log``, with the user's arguments
(``sync_dist`` included).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from popdist_lightning.errors import IPUStrategyError

__all__ = ["FlatStepModule", "LoggedCall", "StepModule", "flat_step_module"]

#: Marker output of a step that returned nothing and logged nothing (outputs cannot be empty).
_NOTHING = "nothing"

LoggedCall = tuple[str, dict[str, Any]]


class _Recorder:
    """Stands in for ``LightningModule.log`` inside a step: keeps names, kwargs and values."""

    def __init__(self) -> None:
        self.calls: list[LoggedCall] = []
        self.values: list[torch.Tensor] = []

    def __call__(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            raise IPUStrategyError(
                f"self.log({name!r}, ...) inside a step: pass the options after the value by "
                f"keyword (prog_bar=..., sync_dist=...) under IPUStrategy"
            )
        if isinstance(value, Mapping):
            raise IPUStrategyError(
                f"self.log({name!r}, <dict>) inside a step: log each value under its own name "
                f"(self.log_dict does this)"
            )
        if isinstance(value, torch.fx.Proxy):  # traced to split a pipelined module
            self.calls.append((name, kwargs))
            self.values.append(value)  # type: ignore[arg-type]
            return
        if isinstance(value, torch.Tensor):
            tensor = value.detach()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            tensor = torch.as_tensor(float(value))
        else:
            raise IPUStrategyError(
                f"self.log({name!r}, {type(value).__name__}) inside a step is not supported "
                f"under IPUStrategy: log a tensor or a number (for a torchmetrics Metric, log "
                f"metric.compute() in an epoch-end hook)"
            )
        if tensor.numel() != 1:
            raise IPUStrategyError(
                f"self.log({name!r}, ...) got a tensor of shape {tuple(tensor.shape)}: log a scalar"
            )
        self.calls.append((name, kwargs))
        self.values.append(tensor.reshape(()).to(torch.float32))


class StepModule(nn.Module):
    """Runs ``module.<step>(*args)`` as ``forward``; returns ``(*logged values, result)``.

    For ``training_step`` the result is the loss (the executor's loss is the last output).
    ``calls`` holds the names and keyword arguments of the last run's ``self.log`` calls.
    """

    def __init__(self, module: nn.Module, step: str) -> None:
        super().__init__()
        self.module = module
        self.step = step
        self.calls: list[LoggedCall] = []
        self.returns_result = True

    @contextlib.contextmanager
    def _capture(self) -> Iterator[_Recorder]:
        recorder = _Recorder()
        had = "log" in self.module.__dict__
        saved = self.module.__dict__.get("log")
        self.module.__dict__["log"] = recorder
        try:
            yield recorder
        finally:
            if had:
                self.module.__dict__["log"] = saved
            else:
                del self.module.__dict__["log"]

    def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """One replica's step on its micro-batch."""
        with self._capture() as recorder:
            result = getattr(self.module, self.step)(*args, **kwargs)
        self.calls = recorder.calls
        values = tuple(recorder.values)
        if self.step == "training_step":
            return (*values, _training_loss(result))
        self.returns_result = result is not None
        if result is None:
            return values if values else (torch.zeros(()),)
        return (*values, result)

    def split(self, outputs: Any) -> tuple[list[torch.Tensor], Any]:
        """The executor's outputs → (logged values, the step's result or ``None``)."""
        if not isinstance(outputs, (tuple, list)):
            outputs = (outputs,)
        n = len(self.calls)
        values = list(outputs[:n])
        rest = outputs[n:]
        if self.step != "training_step" and not self.returns_result:
            return values, None
        return values, rest[0] if rest else None


def _training_loss(result: Any) -> torch.Tensor:
    """The loss of a ``training_step`` result (a tensor, or a dict with "loss")."""
    if isinstance(result, (torch.Tensor, torch.fx.Proxy)):
        return result  # type: ignore[return-value]
    if isinstance(result, Mapping) and isinstance(result.get("loss"), torch.Tensor):
        loss: torch.Tensor = result["loss"]
        return loss
    if result is None:
        raise IPUStrategyError(
            "training_step returned None: under IPUStrategy every training step must return "
            "its loss (skipping a batch is not supported; the executor steps the optimizer)"
        )
    raise IPUStrategyError(
        f"training_step returned {type(result).__name__}: return the loss tensor, or a dict "
        f"with a 'loss' tensor"
    )


class FlatStepModule(StepModule):
    """A step module whose ``forward`` takes the batch's tensors one by one, then ``batch_idx``.

    The stage tracer of a staged module (``BeginBlock``, or ``Block`` contexts the executor
    finds on its first call) follows ``forward`` with one placeholder per named parameter,
    so the batch (a tuple, list or dict of tensors) is flattened into tensors for the call
    and rebuilt here. ``batch_idx`` travels as a 0-dim tensor and reaches the step as an
    ``int`` again (while being traced, as the tracer's placeholder).
    """

    def __init__(self, module: nn.Module, step: str, spec: TreeSpec) -> None:
        super().__init__(module, step)
        self.spec = spec

    def inputs(self, batch: Any) -> list[torch.Tensor]:
        """The batch's tensors, in the order ``forward`` takes them."""
        leaves, spec = tree_flatten(batch)
        if spec != self.spec:
            raise IPUStrategyError(
                f"the batches of {self.step} changed structure (from {self.spec} to {spec}): "
                f"every batch of one loader must have the same structure under IPUStrategy"
            )
        return leaves

    def _run_flat(self, tensors: tuple[Any, ...]) -> tuple[Any, ...]:
        *leaves, batch_idx = tensors
        batch = tree_unflatten(list(leaves), self.spec)
        if isinstance(batch_idx, torch.Tensor):  # not the tracer's placeholder
            batch_idx = int(batch_idx)
        return StepModule.forward(self, batch, batch_idx)


def flat_step_module(module: nn.Module, step: str, batch: Any) -> FlatStepModule:
    """A :class:`FlatStepModule` for batches shaped like ``batch``."""
    leaves, spec = tree_flatten(batch)
    if not leaves or not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        raise IPUStrategyError(
            "a pipelined LightningModule (BeginBlock/Block) needs batches made of tensors only "
            f"(a tensor, or a tuple/list/dict of tensors); got leaves "
            f"{sorted({type(leaf).__name__ for leaf in leaves})}"
        )
    names = [f"t{i}" for i in range(len(leaves))] + ["batch_idx"]
    source = (
        f"def forward(self, {', '.join(names)}):\n"
        f"    return self._run_flat(({', '.join(names)},))\n"
    )
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # one named parameter per input: what the stage tracer needs
    cls = type("PipelinedStep", (FlatStepModule,), {"forward": namespace["forward"]})
    wrapper: FlatStepModule = cls(module, step, spec)
    return wrapper
