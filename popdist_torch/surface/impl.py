"""``poptorch._impl``: the private helpers libraries import from PopTorch, with its behaviour here.

optimum-graphcore's seq2seq trainer imports ``rewrapModelIfNecessary`` and
``unwrapModelIfNecessary`` at its top level; Graphcore's applications call
``poptorch._impl.unwrapIfWrapped``. PopTorch wraps the user's module *in place*: it swaps
the module's class (and its parameters' and buffers') for subclasses of its own, and these
helpers swap them back and forth. Here ``trainingModel`` and ``inferenceModel`` return a
separate :class:`~popdist_torch.PoplarExecutor` and never change the user's module, so
nothing is ever wrapped: ``isWrapped`` is ``False``, the unwrapping and rewrapping change
nothing, and ``unwrapIfWrapped`` returns its argument. Under the opt-in this module is
``poptorch._impl`` itself (``poprun --poptorch-modules``, docs/poptorch-names.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from popdist_torch.surface.toplevel import Error, isRunningOnIpu

__all__ = [
    "createPoptorchError",
    "forEachParameterAndBuffer",
    "isRunningOnIpu",
    "isWrapped",
    "rewrapModelIfNecessary",
    "unwrapIfWrapped",
    "unwrapModelIfNecessary",
]

_T = TypeVar("_T")


def isWrapped(obj: object) -> bool:
    """``False``: the user's modules, parameters and buffers keep their own classes here."""
    return False


def unwrapIfWrapped(obj: _T) -> _T:
    """``obj`` itself (PopTorch: the module with its own class back)."""
    return obj


def unwrapModelIfNecessary(model: nn.Module) -> None:
    """Nothing to do: ``model``, its parameters and buffers were never wrapped."""


def rewrapModelIfNecessary(model: nn.Module) -> None:
    """Nothing to do: there are no PopTorch wrappers to restore."""


def forEachParameterAndBuffer(model: nn.Module, fn: Callable[[str, Any], Any]) -> None:
    """``fn(name, tensor)`` for every buffer, then every parameter, of ``model`` (as PopTorch)."""
    for module_name, module in model.named_modules():
        for name, buffer in module.named_buffers(prefix=module_name, recurse=False):
            fn(name, buffer)
    for name, param in model.named_parameters():
        fn(name, param)


def createPoptorchError(msg: str) -> Error:
    """PopTorch's Python-side error: a :class:`poptorch.Error` with ``type``, ``message`` and
    ``location`` set as PopTorch sets them."""
    kind = "poptorch_py_error"
    error = Error(f"'{kind}': {msg}")
    error.type = kind  # type: ignore[attr-defined]
    error.message = msg  # type: ignore[attr-defined]
    error.location = ""  # type: ignore[attr-defined]
    return error
