"""``torch.ops.poptorch.*``: PopTorch's graph-level operations, registered with torch.

PopTorch registers a ``poptorch`` operator namespace with torch; its Python helpers
(``poptorch.nop``, ``Block``, ``NameScope``, ``MultiConv``...) call these operators, and some
programs call them directly (``torch.ops.poptorch.push_name_scope("enc")``). On an IPU they
steer the graph compiler. Here the model runs on torch, so each is registered with PopTorch's
schema and a kernel that does what the operator means on a host: markers (blocks, name
scopes, multi-convolution bounds, optimizer groups) do nothing, hints (available memory,
recomputation checkpoints, serialisation, overlap) return their tensor, ``ipu_print_tensor``
prints (and its gradient in the backward pass), and the computing operators compute. Operators this project cannot honour are
registered too, with a kernel raising the reason from their row in the surface table.

Kernels are registered for ``CompositeImplicitAutograd`` (autograd flows through the
tensors they return, and ``torch.jit.trace`` and ``torch.jit.script`` record them as
``poptorch::`` nodes that run again when the traced or scripted model runs) and for
``FuncTorchBatched``, so the executor's ``vmap`` over local replicas runs them as they are.
Registration happens once, when :mod:`popdist_torch` is imported, and costs well under a
millisecond; if another library already owns the ``poptorch`` namespace (the real PopTorch),
nothing is registered.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable
from typing import Any, Final

import torch

from popdist_torch.errors import UnsupportedOptionError
from popdist_torch.surface.names import rows_of
from popdist_torch.surface.rows import REFUSED

__all__ = ["NAMESPACE", "SCHEMAS", "register"]

log = logging.getLogger("popdist_torch")

#: The owner of the operators' rows in the surface table.
NAMESPACE: Final = "torch.ops.poptorch"

#: PopTorch 3's operator schemas (with defaults where PopTorch 2 took fewer arguments);
#: identities alias their input (``Tensor(a) -> Tensor(a)``) so no copy is made.
SCHEMAS: dict[str, str] = {
    "begin_ipu_block": "begin_ipu_block(int stage_id, int phase_id, int ipu_id) -> ()",
    "end_ipu_block": "end_ipu_block() -> ()",
    "push_name_scope": "push_name_scope(str name) -> ()",
    "pop_name_scope": "pop_name_scope() -> ()",
    "set_attribute": "set_attribute(str attribute, str key, str value) -> ()",
    "clear_attribute": "clear_attribute(str attribute, str key) -> ()",
    "optimizer_group": "optimizer_group(int group, Tensor[] inputs) -> ()",
    "begin_multi_conv": "begin_multi_conv() -> ()",
    "end_multi_conv": (
        "end_multi_conv(float[]? available_memory_proportions=None, int[]? partials_types=None, "
        "int? plan_type=None, int? per_conv_reserved_tiles=None, float? cycle_back_off=None, "
        "int[]? enableConvDithering=None) -> ()"
    ),
    "nop": "nop(Tensor(a) self) -> Tensor(a)",
    "recomputation_checkpoint": "recomputation_checkpoint(Tensor(a) self) -> Tensor(a)",
    "set_available_memory": "set_available_memory(Tensor(a) t, float mem) -> Tensor(a)",
    "set_matmul_serialization": (
        "set_matmul_serialization(Tensor(a) matmul, str mode, int factor=0, "
        "bool keep_precision=False) -> Tensor(a)"
    ),
    "set_overlap_for_input": "set_overlap_for_input(Tensor(a) t, str mode) -> Tensor(a)",
    "set_overlap_for_output": "set_overlap_for_output(Tensor(a) t, str mode) -> Tensor(a)",
    "ipu_print_tensor": (
        'ipu_print_tensor(Tensor(a) self, str title="", int print_gradient=1, '
        "int summarize_threshold=1000, int edge_items=3, int max_line_width=80, int digits=4, "
        'int float_format=0, str separator=", ", str open_bracket="(", '
        'str close_bracket=")") -> Tensor(a)'
    ),
    "identity_loss": "identity_loss(Tensor x, int reduction) -> Tensor",
    "dynamic_slice": (
        "dynamic_slice(Tensor self, int dim, Tensor start, int size, int step) -> Tensor"
    ),
    "dynamic_update": (
        "dynamic_update(Tensor self, Tensor src, int dim, Tensor start, int size) -> Tensor"
    ),
    "start_for_loop": "start_for_loop(Tensor[] inputs) -> ()",
    "end_for_loop": "end_for_loop(Tensor[] outputs, Tensor[] inputs, int trip_count) -> Tensor[]",
    "start_if_block": "start_if_block(Tensor condition) -> ()",
    "start_else_block": "start_else_block(Tensor[] outputs_true) -> ()",
    "end_if_block": "end_if_block(Tensor[] outputs, Tensor condition) -> Tensor[]",
    "call_cpu_op": "call_cpu_op(Tensor[] inputs, str name) -> ()",
    "end_cpu_op": "end_cpu_op(Tensor[] output) -> Tensor[]",
    "custom_operation": (
        "custom_operation(Tensor[] inputs, str name, str domain, int domain_version, "
        "int num_outputs, Tensor[] outputs, str attributes) -> Tensor[]"
    ),
    "ctc_beam_search_decoder": (
        "ctc_beam_search_decoder(Tensor probs, Tensor lengths, int blank, int beam_width, "
        "int top_paths) -> (Tensor, Tensor, Tensor)"
    ),
    "fps": "fps(Tensor src, int[] ptr, float ratio, bool random_start) -> Tensor",
    "nearest": "nearest(Tensor x, Tensor y, Tensor batch_x, Tensor batch_y) -> Tensor",
    "nearest_batch_list": (
        "nearest_batch_list(Tensor x, Tensor y, int[] batch_x, int[] batch_y) -> Tensor"
    ),
}


def _nothing(*args: Any) -> None:
    """A marker for the IPU graph compiler: there is none, so nothing happens."""
    return None


def _first(tensor: torch.Tensor, *args: Any) -> torch.Tensor:
    """A compiler hint on a tensor: the tensor itself."""
    return tensor


def _shown(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` without functorch's wrappers: under the executor's ``vmap`` (and ``grad``)
    the replicas' values print together, as one tensor with the replicas first."""
    from torch._C._functorch import get_unwrapped, is_batchedtensor, is_gradtrackingtensor

    while is_batchedtensor(tensor) or is_gradtrackingtensor(tensor):
        tensor = get_unwrapped(tensor)
    return tensor


class _PrintGradient(torch.autograd.Function):
    """Identity whose backward prints the gradient after ``<title>_gradient``, as PopTorch."""

    generate_vmap_rule = True

    @staticmethod
    def forward(tensor: torch.Tensor, title: str) -> torch.Tensor:
        return tensor.view_as(tensor)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.title = inputs[1]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        builtins.print(f"{ctx.title}_gradient{_shown(grad)}")
        return grad, None


def print_tensor(
    tensor: torch.Tensor, title: str = "", print_gradient: int = 1, *args: Any
) -> torch.Tensor:
    """Print ``tensor`` (after ``title``) when the model runs; returns it.

    With ``print_gradient`` (PopTorch's default) and a tensor that needs a gradient, the
    backward pass prints its gradient after ``<title>_gradient`` (not inside functorch's
    transforms, where the executor's fused replicas run: a custom autograd function cannot
    run from a kernel there).
    """
    shown = _shown(tensor)
    builtins.print(f"{title}{shown}" if title else shown)
    if print_gradient and tensor.requires_grad and shown is tensor:
        out: torch.Tensor = _PrintGradient.apply(tensor, title)  # type: ignore[no-untyped-call]
        return out
    return tensor


def _identity_loss(x: torch.Tensor, reduction: int) -> torch.Tensor:
    """PopTorch's integer reductions: 0 sum, 1 mean, 2 none (``poptorch.identity_loss``)."""
    from popdist_torch.execution.executor import identity_loss

    names = {0: "sum", 1: "mean", 2: "none"}
    if reduction not in names:
        raise ValueError(
            f"torch.ops.poptorch.identity_loss(reduction={reduction}): expected 0 (sum), "
            f"1 (mean) or 2 (none)"
        )
    return identity_loss(x, names[reduction])


def _dynamic_slice(
    tensor: torch.Tensor, dim: int, start: torch.Tensor, size: int, step: int
) -> torch.Tensor:
    from popdist_torch.surface.ops import dynamic_slice

    return dynamic_slice(tensor, dim, start, size, step)


def _dynamic_update(
    tensor: torch.Tensor, src: torch.Tensor, dim: int, start: torch.Tensor, size: int
) -> torch.Tensor:
    from popdist_torch.surface.ops import dynamic_update

    return dynamic_update(tensor, src, dim, start, size)


#: The kernels of the operators that are not refused, by name.
KERNELS: dict[str, Callable[..., Any]] = {
    **dict.fromkeys(
        (
            "begin_ipu_block",
            "end_ipu_block",
            "push_name_scope",
            "pop_name_scope",
            "set_attribute",
            "clear_attribute",
            "optimizer_group",
            "begin_multi_conv",
            "end_multi_conv",
        ),
        _nothing,
    ),
    **dict.fromkeys(
        (
            "nop",
            "recomputation_checkpoint",
            "set_available_memory",
            "set_matmul_serialization",
            "set_overlap_for_input",
            "set_overlap_for_output",
        ),
        _first,
    ),
    "ipu_print_tensor": print_tensor,
    "identity_loss": _identity_loss,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update": _dynamic_update,
}

_library: torch.library.Library | None = None


def _refusing(message: str) -> Callable[..., Any]:
    def refuse(*args: Any) -> Any:
        raise UnsupportedOptionError(message)

    return refuse


def register() -> bool:
    """Register the ``poptorch`` operators with torch (once); ``False`` if taken already."""
    global _library
    if _library is not None:
        return True
    try:
        library = torch.library.Library("poptorch", "DEF")  # type: ignore[no-untyped-call]
    except RuntimeError:  # the real PopTorch (or another stand-in) owns the namespace
        log.debug("torch.ops.poptorch is registered by another library; leaving it")
        return False
    for row in rows_of(NAMESPACE):
        kernel = _refusing(row.message()) if row.status == REFUSED else KERNELS[row.name]
        name = library.define(SCHEMAS[row.name])  # type: ignore[no-untyped-call]
        library.impl(name, kernel, "CompositeImplicitAutograd")  # type: ignore[no-untyped-call]
        library.impl(name, kernel, "FuncTorchBatched")  # type: ignore[no-untyped-call]
    _library = library
    return True
