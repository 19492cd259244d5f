"""Anchored tensors: what ``Options.anchorTensor`` asks a wrapped model to keep after a call.

PopTorch names the tensors of its graph; here the names are those of the module:

- ``"<param>"`` and ``"UpdatedVar___<param>"`` (``"fc.weight"``: the parameter's name in
  ``named_parameters()``, dots kept as PopTorch keeps them): the parameter's value after
  the device iteration's update (training) or as the call used it (inference);
- ``"Gradient___<param>"`` (training): the gradient the optimizer applied in that update:
  summed over the accumulation steps and local replicas and reduced over the instances (the
  ``Mean`` or ``Sum`` the options ask for), so every instance reads the same tensor, unscaled
  when the optimizer has a ``loss_scaling`` and, for a half-precision parameter, rounded to
  its type. It is the parameter's ``.grad`` after the call's last update;
- a name that matches no parameter, buffer or submodule exactly names the one whose
  dotted name ends with it, or that it ends with (``Gradient___fc2.bias`` for
  ``model.fc2.bias`` when the module is wrapped in another, as Lightning wraps it);
- ``"<buffer>"``: a buffer's value after the iteration (BatchNorm statistics);
- ``"Output___<module>"`` (``"Output___net.0"``): a submodule's output in every micro-batch
  of every local replica, laid out as the model's own outputs (``docs/executor.md``). Its
  forward hook cannot see inside the replicas' ``vmap``, so a model with such an anchor runs
  its local replicas one after the other (same numbers, slower); pipelined models cannot
  anchor submodule outputs.

Per-update tensors (parameters, gradients, buffers) are kept once per device iteration,
submodule outputs once per micro-batch; the anchor's output mode (the model's when the
anchor has none) picks which are returned, with the model outputs' layout: ``Final`` is
the tensor itself, ``All`` or ``EveryN`` concatenate the kept copies along dimension 0,
``Sum`` adds them. Nothing here runs for a model without anchors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from popdist_torch.enums import OutputMode
from popdist_torch.errors import ExecutorError, ExecutorStateError
from popdist_torch.execution.outputs import OutputCollector
from popdist_torch.options import Options

__all__ = ["GRADIENT", "OUTPUT", "UPDATED", "Anchors", "tensor_names"]

GRADIENT = "Gradient___"
UPDATED = "UpdatedVar___"
OUTPUT = "Output___"


def tensor_names(model: nn.Module, *, training: bool) -> list[str]:
    """Every name an anchor can take on ``model`` (``getTensorNames()``)."""
    names: list[str] = []
    for name, _ in model.named_parameters():
        names.append(name)
        if training:
            names += [GRADIENT + name, UPDATED + name]
    names += [name for name, _ in model.named_buffers()]
    names += [OUTPUT + name for name, _ in model.named_modules() if name]
    return names


class _Anchor:
    """One anchor: where its tensor comes from and what this call kept of it."""

    def __init__(
        self, short_name: str, mode: OutputMode, period: int, read: Callable[[], Any] | None
    ) -> None:
        self.short_name = short_name
        self.mode = mode
        self.period = period
        self.read = read  # per-update tensors; None for a submodule's output
        self.collector: OutputCollector | None = None
        self.records: dict[tuple[int, int], list[torch.Tensor]] = {}


class Anchors:
    """The anchors of one wrapped model, resolved against its module when it is wrapped."""

    def __init__(self, model: nn.Module, options: Options, *, training: bool) -> None:
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        modules = {name: m for name, m in model.named_modules() if name}
        self._anchors: dict[str, _Anchor] = {}
        self._values: dict[str, Any] = {}
        self._step: tuple[int, int] = (0, 0)
        self._hooks: list[Any] = []
        for request in options.anchored_tensors:
            mode = options.output_mode if request.output_mode is None else request.output_mode
            period = options.output_return_period if request.output_mode is None else 1
            if request.output_mode == OutputMode.EveryN:
                period = request.output_return_period
            if mode == OutputMode.Default:
                mode = OutputMode.Final if training else OutputMode.All
            if mode == OutputMode.EveryN and options.device_iterations % period:
                raise ExecutorError(
                    f"anchorTensor({request.short_name!r}, output_mode=EveryN, "
                    f"output_return_period={period}) needs deviceIterations "
                    f"({options.device_iterations}) to be a multiple of the period"
                )
            anchor = _Anchor(request.short_name, mode, period, None)
            name = request.long_name
            head, sep, tail = name.partition("___")
            prefix, stem = (head + sep, tail) if sep else ("", name)
            param, buffer, module = _find(stem, params), _find(stem, buffers), _find(stem, modules)
            if training and prefix == GRADIENT and param is not None:
                anchor.read = _gradient(param)
            elif ((training and prefix == UPDATED) or not prefix) and param is not None:
                anchor.read = _value(param)
            elif not prefix and buffer is not None:
                anchor.read = _value(buffer)
            elif prefix == OUTPUT and isinstance(module, nn.Module):
                self._hooks.append(module.register_forward_hook(self._recorder(anchor)))
            else:
                known = tensor_names(model, training=training)
                raise ExecutorError(
                    f"anchorTensor({request.short_name!r}, {name!r}): the model has no tensor "
                    f"of that name; model.getTensorNames() lists them (e.g. "
                    f"{', '.join(repr(n) for n in known[:3])})"
                )
            self._anchors[request.short_name] = anchor

    @property
    def watches_outputs(self) -> bool:
        """Whether a submodule's output is anchored (its replicas must run in turn)."""
        return bool(self._hooks)

    def start(self, iterations: int, steps: int) -> None:
        """A call of ``iterations`` device iterations of ``steps`` micro-batches begins."""
        for anchor in self._anchors.values():
            per_iteration = 1 if anchor.read is not None else steps
            anchor.collector = OutputCollector(
                anchor.mode, iterations, per_iteration, anchor.period
            )
            anchor.records = {}

    def at_step(self, iteration: int, step: int) -> None:
        """The micro-batch the next forward passes belong to."""
        self._step = (iteration, step)

    def after_update(self, iteration: int) -> None:
        """Keep the per-update tensors of device iteration ``iteration``."""
        for anchor in self._anchors.values():
            collector = anchor.collector
            if anchor.read is None or collector is None or not collector.wants(iteration, 0):
                continue
            value = anchor.read()
            if value is not None:
                collector.add(iteration, 0, value.detach().clone().unsqueeze(0))

    def finish(self) -> None:
        """The call ended: lay out what each anchor kept, as its output mode returns it."""
        for anchor in self._anchors.values():
            collector = anchor.collector
            if collector is None:
                continue
            for (iteration, step), tensors in anchor.records.items():
                collector.add(iteration, step, torch.stack(tensors))
            anchor.records = {}
            # nothing kept this call (an unused gradient): the last value stays
            with contextlib.suppress(ExecutorStateError):
                self._values[anchor.short_name] = _to_host(collector.result())

    def value(self, short_name: str) -> Any:
        """``getAnchoredTensor(short_name)``."""
        if short_name not in self._anchors:
            names = ", ".join(repr(n) for n in self._anchors) or "none"
            raise ExecutorError(
                f"getAnchoredTensor({short_name!r}): no anchor of that name (anchors: {names}); "
                f"add one with opts.anchorTensor({short_name!r}, <tensor name>)"
            )
        if short_name not in self._values:
            raise ExecutorStateError(
                f"getAnchoredTensor({short_name!r}): the model has not run yet; call it first"
            )
        return self._values[short_name]

    def remove(self) -> None:
        """Unregister the forward hooks."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def _recorder(self, anchor: _Anchor) -> Callable[..., None]:
        def record(module: nn.Module, inputs: Any, output: Any) -> None:
            collector = anchor.collector
            if collector is None or not isinstance(output, torch.Tensor):
                return
            if collector.wants(*self._step):
                anchor.records.setdefault(self._step, []).append(output.detach())

        return record


def _find(name: str, table: dict[str, Any]) -> Any:
    """``table[name]``, else the one entry whose name ends with ``.name`` or that ``name``
    ends with (a model wrapped in another module, as Lightning does, or unwrapped)."""
    if name in table:
        return table[name]
    near = [v for k, v in table.items() if k.endswith("." + name) or name.endswith("." + k)]
    return near[0] if len(near) == 1 else None


def _gradient(param: torch.Tensor) -> Callable[[], torch.Tensor | None]:
    return lambda: param.grad


def _value(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: tensor


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.cpu()
    return value
