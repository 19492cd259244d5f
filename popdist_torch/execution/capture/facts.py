"""What a replay would not repeat, found by watching the first eager fused step.

:class:`StepWatch` is a ``TorchDispatchMode`` around that one step (forward and backward;
the mode sees inside ``vmap`` and follows autograd into its threads): it notes the
operations that draw random numbers (``Tag.nondeterministic_seeded``: dropout), those whose
result the host reads or whose shape follows the data (``Tag.data_dependent_output``,
``Tag.dynamic_output_shape``: ``.item()``, ``nonzero``) and whether saved-tensor hooks
(activation checkpointing) were active. :func:`hooks_of` lists the module and tensor hooks a
replay would not run; :func:`hook_count` is the cheap form the replay's guard compares.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["StepWatch", "hook_count", "hooks_of"]

_RANDOM = torch.Tag.nondeterministic_seeded
_DATA_DEPENDENT = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)

#: A module's hook dictionaries a forward or backward pass runs, by kind.
_MODULE_HOOKS = (
    ("forward pre-hook", "_forward_pre_hooks"),
    ("forward hook", "_forward_hooks"),
    ("backward pre-hook", "_backward_pre_hooks"),
    ("backward hook", "_backward_hooks"),
)
#: A parameter's hooks a backward pass runs, by kind.
_TENSOR_HOOKS = (
    ("tensor hook", "_backward_hooks"),
    ("post-accumulate hook", "_post_accumulate_grad_hooks"),
)
_GLOBAL = vars(nn.modules.module)


class StepWatch(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Watches one eager step for random numbers, data-dependent operations and saved-tensor
    hooks (the names of the operations, once each)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.random_ops: list[str] = []
        self.data_dependent_ops: list[str] = []
        self.saved_tensor_hooks = False

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        tags = func.tags
        name = str(func.overloadpacket)
        if _RANDOM in tags and name not in self.random_ops:
            self.random_ops.append(name)
        if any(t in tags for t in _DATA_DEPENDENT) and name not in self.data_dependent_ops:
            self.data_dependent_ops.append(name)
        if not self.saved_tensor_hooks:
            top = torch._C._autograd._top_saved_tensors_default_hooks(False)
            self.saved_tensor_hooks = top is not None
        return func(*args, **(kwargs or {}))


def hooks_of(model: nn.Module) -> tuple[str, ...]:
    """The hooks a forward and backward pass of ``model`` runs: ``"forward hook on net.0"``,
    ``"tensor hook on fc.weight"``, ``"global forward hook"``."""
    found = [f"global {kind}" for kind, attr in _MODULE_HOOKS if _GLOBAL.get(f"_global{attr}")]
    for name, module in model.named_modules():
        found += [
            f"{kind} on {name or 'the model'}"
            for kind, attr in _MODULE_HOOKS
            if getattr(module, attr, None)
        ]
    for name, param in model.named_parameters():
        found += [f"{kind} on {name}" for kind, attr in _TENSOR_HOOKS if getattr(param, attr, None)]
    return tuple(found)


def hook_count(modules: Sequence[nn.Module], params: Sequence[torch.Tensor]) -> int:
    """How many hooks ``modules`` and ``params`` have, global module hooks included."""
    count = sum(len(_GLOBAL.get(f"_global{attr}") or ()) for _, attr in _MODULE_HOOKS)
    for module in modules:
        count += sum(len(getattr(module, attr, None) or ()) for _, attr in _MODULE_HOOKS)
    for param in params:
        count += sum(len(getattr(param, attr, None) or ()) for _, attr in _TENSOR_HOOKS)
    return count
