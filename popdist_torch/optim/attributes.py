"""PopTorch's ``optimizer.variable_attrs``: which hyper-parameters may change after compiling.

PopTorch embeds the *constant* attributes of an optimizer in the compiled program and
streams the *variable* ones to the device at each call. By default the attributes passed to
a ``poptorch.optim`` optimizer's constructor (with a value other than ``None``) are variable
and the others constant; ``markAsConstant`` / ``markAsVariable`` change that before the
model first runs, and changing a constant attribute afterwards is an error.

Nothing is compiled here, but a program written for PopTorch relies on the same contract,
so it keeps it: when a training model first runs, the values of the constant attributes are
recorded (:meth:`VariableAttributes.freeze`); each later call compares them
(:meth:`VariableAttributes.check`) and a change is one :class:`OptimizerError` line naming
the attribute, both values and the fix, before the call runs anything. Variable attributes
(a learning rate a scheduler changes) change freely.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from popdist_torch.errors import OptimizerError

__all__ = ["VariableAttributes", "check_constants"]

#: The attribute every PopTorch optimizer has besides its param groups' keys.
GLOBAL_ATTRIBUTES = ("loss_scaling",)


class VariableAttributes:
    """Which of an optimizer's attributes are variable; the others are constant.

    ``variables``: the attributes passed to the constructor; ``allowed``: every attribute
    the optimizer has (its param groups' keys and ``loss_scaling``).
    """

    def __init__(self, variables: Iterable[str], allowed: Iterable[str]) -> None:
        self._allowed = tuple(dict.fromkeys(allowed))
        self._variables = [name for name in dict.fromkeys(variables) if name in self._allowed]
        self._frozen: dict[str, Any] | None = None

    def isConstant(self, attr: str) -> bool:
        """Whether ``attr`` is constant (fixed once the model has run)."""
        return attr not in self._variables

    def markAsConstant(self, attr: str) -> None:
        """Make ``attr`` constant (before the model first runs)."""
        self._check_known(attr)
        self._variables = [name for name in self._variables if name != attr]

    def markAsVariable(self, attr: str) -> None:
        """Make ``attr`` variable: it may change between calls."""
        self._check_known(attr)
        if attr not in self._variables:
            self._variables.append(attr)

    def _check_known(self, attr: str) -> None:
        if attr not in self._allowed:
            raise OptimizerError(
                f"variable_attrs: unknown attribute {attr!r}: use one of {list(self._allowed)}"
            )

    def constants(self) -> list[str]:
        """The optimizer's constant attributes."""
        return [name for name in self._allowed if name not in self._variables]

    @property
    def frozen(self) -> bool:
        """Whether a model has run with this optimizer (its constants are recorded)."""
        return self._frozen is not None

    def freeze(self, optimizer: torch.optim.Optimizer) -> None:
        """Record the constant attributes' values: the model runs with these from now on."""
        self._frozen = _constant_values(optimizer, self)

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        """Raise if a constant attribute recorded by :meth:`freeze` has changed."""
        if self._frozen is None:
            return
        now = _constant_values(optimizer, self, only=self._frozen)
        for key, before in self._frozen.items():
            after = now.get(key, before)
            if not _same(before, after):
                attr, _, where = key.partition("@")
                place = f" (param group {where})" if where else ""
                raise OptimizerError(
                    f"{type(optimizer).__name__}.{attr}{place} changed from {before!r} to "
                    f"{after!r} after the model first ran, but it is a constant attribute: "
                    f"pass {attr} to the optimizer's constructor, or call "
                    f"optimizer.variable_attrs.markAsVariable({attr!r}) before the first run"
                )

    def __repr__(self) -> str:
        return f"VariableAttributes(variables={self._variables!r})"


def check_constants(optimizer: torch.optim.Optimizer | None) -> None:
    """At each training call: record ``optimizer``'s constants the first time, then compare.

    Optimizers without ``variable_attrs`` (torch's own) change freely.
    """
    attrs = getattr(optimizer, "variable_attrs", None)
    if optimizer is None or not isinstance(attrs, VariableAttributes):
        return
    if attrs.frozen:
        attrs.check(optimizer)
    else:
        attrs.freeze(optimizer)


def _constant_values(
    optimizer: torch.optim.Optimizer,
    attrs: VariableAttributes,
    only: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``{"name@group": value}`` of the constant attributes of each param group."""
    if only is None:
        constant = attrs.constants()
    else:
        constant = sorted({key.partition("@")[0] for key in only})
    out: dict[str, Any] = {}
    for index, group in enumerate(optimizer.param_groups):
        for name in constant:
            if name in group:
                out[f"{name}@{index}"] = _snapshot(group[name])
    return out


def _snapshot(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return bool(torch.equal(torch.as_tensor(a), torch.as_tensor(b)))
    return bool(a == b)
