"""PopTorch's in-model operations (``poptorch.nop``, ``poptorch.for_loop``...) on torch.

On an IPU these steer the graph compiler; here the model runs eagerly on the host (or a
GPU), so each computes what PopTorch computes with plain torch, and the compiler hints
(memory proportions, overlap, name scopes, multi-convolution plans) return their input.

Models calling them can be traced (``torch.jit.trace``) and scripted (``torch.jit.script``):
``nop``, ``set_available_memory`` and ``ipu_print_tensor`` compile as they are (the last
one runs the registered ``torch.ops.poptorch.ipu_print_tensor``, so a scripted or traced
model still prints), and ``recomputationCheckpoint``, whose varying arguments TorchScript
cannot compile, runs as Python from a scripted model (``torch.jit.ignore``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

import torch

from popdist_torch.enums import MatMulSerializationMode, MultiConvPlanType, OverlapMode

__all__ = [
    "CPU",
    "Attribute",
    "MultiConv",
    "NameScope",
    "cond",
    "dynamic_slice",
    "dynamic_update",
    "for_loop",
    "ipu_print_tensor",
    "nop",
    "recomputationCheckpoint",
    "serializedMatMul",
    "set_available_memory",
    "set_overlap_for_input",
    "set_overlap_for_output",
]


def nop(tensor: torch.Tensor) -> torch.Tensor:
    """Return ``tensor`` (PopTorch inserts an operation the compiler cannot remove)."""
    return tensor


def ipu_print_tensor(
    tensor: torch.Tensor,
    title: str = "",
    print_gradient: bool = True,
    summarise_threshold: int = 1000,
    edge_items: int = 3,
    max_line_width: int = 80,
    digits: int = 4,
    float_format: str = "auto",
    separator: str = ", ",
    open_bracket: str = "(",
    close_bracket: str = ")",
) -> torch.Tensor:
    """Print ``tensor`` (after ``title``) when the model runs; returns it.

    With ``print_gradient`` the backward pass prints the gradient after ``<title>_gradient``.
    PopTorch's formatting arguments are accepted; torch formats the tensor. The printing is
    the registered operator's, so traced and scripted models print too.
    """
    return torch.ops.poptorch.ipu_print_tensor(  # type: ignore[no-any-return]
        tensor, title, int(print_gradient)
    )


def _recomputation_checkpoint(*values: Any) -> Any:
    """Return the values as given: a tensor, a tuple, a list, a dict, any nesting of them.

    One value returns it (a list or tuple: a copy of the same type), several a tuple, as
    PopTorch. It is a marker, so it takes whatever a forward or a forward hook passes (a
    ``ModelOutput``, the traced values while a model is split into stages) and never
    changes a number. A model staged at its blocks as it runs (``popdist_torch.pipeline``)
    recomputes in backward the ``BeginBlock`` modules whose outputs it was given, as PopTorch
    recomputes from a checkpoint: less memory, the same numbers; elsewhere activations are kept.
    """
    if len(values) == 1:
        only = values[0]
        out = type(only)(only) if type(only) in (tuple, list) else only
    else:
        out = tuple(values)
    # Staging runs only once the pipeline package is loaded: no import for a plain model.
    pipeline: Any = sys.modules.get("popdist_torch.pipeline")
    if pipeline is not None:
        pipeline.note_checkpoint(out)
    return out


# TorchScript cannot read annotated varying arguments: without annotations it takes them
# as tensors, and a scripted model calls the function as Python.
_recomputation_checkpoint.__annotations__ = {}
_recomputation_checkpoint.__name__ = "recomputationCheckpoint"
_recomputation_checkpoint.__qualname__ = "recomputationCheckpoint"

#: PopTorch's ``recomputationCheckpoint(*tensors)``.
recomputationCheckpoint: Callable[..., Any] = torch.jit.ignore(_recomputation_checkpoint)  # type: ignore[no-untyped-call]


def for_loop(
    count: int, body: Callable[..., Any], inputs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Run ``body`` ``count`` times, each output feeding the next iteration's inputs."""
    if not isinstance(inputs, list) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise ValueError("for_loop expects its inputs as a list of tensors")
    values: list[torch.Tensor] = [t.clone() for t in inputs]
    for _ in range(count):
        out = body(*values)
        values = list(out) if isinstance(out, (list, tuple)) else [out]
        if len(values) != len(inputs):
            raise ValueError(
                f"for_loop body returned {len(values)} tensors for {len(inputs)} inputs; "
                "it must return as many tensors as it takes"
            )
    return values


def cond(
    condition: torch.Tensor,
    then_body: Callable[..., Any],
    then_inps: list[torch.Tensor],
    else_body: Callable[..., Any],
    else_inps: list[torch.Tensor],
) -> list[torch.Tensor]:
    """Run ``then_body(*then_inps)`` if ``condition`` is true, else ``else_body(*else_inps)``."""
    out = then_body(*then_inps) if bool(condition) else else_body(*else_inps)
    return [out] if isinstance(out, torch.Tensor) else list(out)


def dynamic_slice(
    tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int
) -> torch.Tensor:
    """``tensor[start:start + size:step]`` along ``dim`` (``start`` may be a tensor)."""
    begin = int(start)
    index = torch.arange(begin, begin + size, step, device=tensor.device)
    return tensor.index_select(dim, index)


def dynamic_update(
    input: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int
) -> torch.Tensor:
    """A copy of ``input`` with ``src`` written at ``start:start+size`` along ``dim``."""
    out = input.clone()
    out.narrow(dim, int(start), size).copy_(src)
    return out


def serializedMatMul(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    mode: MatMulSerializationMode,
    factor: int = 0,
    keep_precision: bool = False,
) -> torch.Tensor:
    """``lhs @ rhs`` (PopTorch splits it to save IPU memory; torch computes it whole)."""
    MatMulSerializationMode(mode)
    return torch.matmul(lhs, rhs)


def set_available_memory(tensor: torch.Tensor, available_memory_proportion: float) -> torch.Tensor:
    """Return ``tensor``: there is no IPU tile memory to plan."""
    return tensor


def set_overlap_for_input(input_tensors: Any, mode: OverlapMode) -> Any:
    """Return the inputs: there are no IO tiles to overlap."""
    OverlapMode(mode)
    return input_tensors


def set_overlap_for_output(output_tensors: Any, mode: OverlapMode) -> Any:
    """Return the outputs: there are no IO tiles to overlap."""
    OverlapMode(mode)
    return output_tensors


class CPU:
    """Run ``layer_to_call`` on the host: here the whole model already runs there."""

    def __init__(self, layer_to_call: Callable[..., Any], ID: str) -> None:
        self._layer_to_call = layer_to_call
        self._ID = ID

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._layer_to_call(*args, **kwargs)


class _NoEffectContext:
    """A ``with`` block that changes nothing here (IPU-only scoping)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class Attribute(_NoEffectContext):
    """Context attaching attributes (``__outline={"layer": "embedding"}``) to the IPU
    operations inside it, for PopART's outlining; there are no graph operations here, so it
    keeps them and changes nothing.
    """

    def __init__(self, **attributes: Any) -> None:
        self.attributes = attributes


class NameScope(_NoEffectContext):
    """Context naming the operations inside it in the IPU graph; changes nothing here."""

    def __init__(self, name: str) -> None:
        self.name = name


class MultiConv(_NoEffectContext):
    """Context grouping convolutions for the IPU planner; here they run one by one.

    The planner settings are accepted and chain, as in PopTorch.
    """

    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}

    def _set(self, name: str, value: Any) -> MultiConv:
        self.settings[name] = value
        return self

    def availableMemoryProportions(self, value: float | Sequence[float]) -> MultiConv:
        """Accepted: no tile memory to plan."""
        return self._set("available_memory_proportions", value)

    def partialsTypes(self, value: Any) -> MultiConv:
        """Accepted: partials use the model's dtype."""
        return self._set("partials_types", value)

    def planType(self, value: MultiConvPlanType) -> MultiConv:
        """Accepted: convolutions run one after the other."""
        return self._set("plan_type", MultiConvPlanType(value))

    def perConvReservedTiles(self, value: int) -> MultiConv:
        """Accepted: there are no tiles."""
        return self._set("per_conv_reserved_tiles", value)

    def cycleBackOff(self, value: float) -> MultiConv:
        """Accepted: there is no planner."""
        return self._set("cycle_back_off", value)

    def enableConvDithering(self, value: bool | Sequence[bool]) -> MultiConv:
        """Accepted: there is no tile placement."""
        return self._set("enable_conv_dithering", value)
