"""What every PopTorch optimizer here shares: its arguments, loss scaling, clipping, precision.

PopTorch computes an update in the precision its arguments name, whatever the weights' own
type: ``accum_type`` is the type of the gradients the update reads, and the
``*_momentum_accum_type`` / ``velocity_accum_type`` arguments the types the optimizer's
state is stored in, all ``torch.float32`` by default. A model cast to ``half()`` therefore
trains: its moments and the arithmetic of its update are float32, only the weights (and the
forward and backward passes) are float16. Torch's optimizers keep their state in the
parameter's type instead, so with float16 weights Adam's second moment underflows (its
``eps`` of 1e-8 is 0 in float16) and the update blows up.

:class:`PopTorchOptimizer` gives a torch optimizer PopTorch's precision without rewriting
its update: for each parameter whose type or state types differ from what the update
computes in, the step runs torch's own update on a float32 *working copy* of the parameter
and its gradient (the state converted to float32 for the step), then rounds the result back
into the parameter, its ``.grad`` (the gradient that was applied) and the state into the
types the arguments name. Float32 parameters with float32 state (the common case) are
stepped in place, exactly as torch steps them.

Over the accumulation steps of one update, gradients still sum in the parameters' ``.grad``,
in the parameters' type (torch allows no other); ``accum_type`` applies from there on: the
gradient is converted to it, unscaled, clipped and read by the update.

Loss scaling: the executor multiplies the loss by ``loss_scaling`` before the backward pass
(so small float16 gradients do not flush to zero) and tells the optimizer, which divides the
gradients by it in ``accum_type`` before clipping and updating. An optimizer stepped
outside the executor sees unscaled gradients and divides nothing.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, cast, overload

import torch

from popdist_torch.errors import OptimizerError
from popdist_torch.optim.attributes import GLOBAL_ATTRIBUTES, VariableAttributes
from popdist_torch.surface.names import rows_of
from popdist_torch.surface.rows import REFUSED

__all__ = [
    "Params",
    "PopTorchOptimizer",
    "given",
    "loss_scaling_of",
    "or_default",
    "torch_keywords",
]

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]

#: PopTorch's optimizer arguments, as the surface table has them (owner ``optim``).
_ARGUMENTS = {row.name: row for row in rows_of("optim")}

#: The types PopTorch accepts for gradients and optimizer state.
ACCUM_TYPES = (torch.float32, torch.float16)

#: Parameter types whose update is computed in float32 (PopTorch's half-precision weights).
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def given(arguments: dict[str, Any]) -> list[str]:
    """The names of the arguments passed with a value (PopTorch: ``None`` is "not given")."""
    return [name for name, value in arguments.items() if value is not None]


def or_default(value: Any, default: Any) -> Any:
    """``value``, or PopTorch's (torch's) ``default`` when it is ``None``."""
    return default if value is None else value


def torch_keywords(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Torch's own keyword arguments (``foreach``, ``maximize``...) without the ``None`` ones."""
    return {name: value for name, value in kwargs.items() if value is not None}


def refuse_argument(name: str, value: Any) -> None:
    """Raise if the surface table refuses ``name=value``, with its row's reason."""
    row = _ARGUMENTS[name]
    if row.status == REFUSED and (row.when is None or row.when(value)):
        raise OptimizerError(f"{name}={value!r} is not supported: {row.note}")


def accum_type(name: str, value: Any) -> torch.dtype:
    """``value`` of a PopTorch accumulator-type argument; ``None`` is float32, the default."""
    refuse_argument(name, value)
    if value is None:
        return torch.float32
    if value in ACCUM_TYPES:
        return value  # type: ignore[no-any-return]
    raise OptimizerError(
        f"{name}={value!r} is invalid: use torch.float32 (the default) or torch.float16"
    )


def scaling(name: str, value: Any) -> float:
    """A positive finite scaling factor; ``None`` is 1.0 (no scaling)."""
    if value is None:
        return 1.0
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value > 0)
    ):
        raise OptimizerError(
            f"{name}={value!r} is invalid: use a positive finite number (1.0: no scaling)"
        )
    return float(value)


def max_grad_norm(value: Any) -> float | None:
    """PopTorch's ``max_grad_norm``; ``None`` or ``inf`` (the default) clips nothing."""
    if value is None or value == math.inf:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise OptimizerError(
            f"max_grad_norm={value!r} is invalid: use a positive number, or None for no clipping"
        )
    return float(value)


def flag(name: str, value: Any, default: bool) -> bool:
    """A boolean argument; ``None`` is PopTorch's default."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise OptimizerError(f"{name}={value!r} is invalid: use True or False")
    return value


@dataclass
class _Working:
    """A parameter stepped through a working copy: where it sits, and the copy."""

    group: dict[str, Any]
    index: int
    param: torch.Tensor
    working: torch.Tensor


class PopTorchOptimizer:
    """PopTorch's arguments on a torch optimizer (a mixin before the torch class).

    Subclasses set ``_state_types``: which argument names the stored type of each state
    entry (``{"exp_avg": "first_order_momentum_accum_type", ...}``).
    """

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]
    state: Any  # torch's defaultdict of per-parameter state
    max_grad_norm: float | None
    accum_type: torch.dtype
    _state_types: ClassVar[dict[str, str]] = {}
    _torch_optimizer: type[torch.optim.Optimizer]
    _gradient_scale: float = 1.0
    _owned: set[int] | None = None

    variable_attrs: VariableAttributes

    def _track_variables(self, passed: Iterable[str]) -> None:
        """PopTorch's ``variable_attrs``: the attributes ``passed`` are variable, others constant."""
        self.variable_attrs = VariableAttributes(passed, [*self.defaults, *GLOBAL_ATTRIBUTES])

    def __getstate__(self) -> dict[str, Any]:
        """Torch's state plus PopTorch's attributes (``copy.deepcopy`` and pickle keep them)."""
        state = dict(cast("dict[str, Any]", super().__getstate__()))
        state.update((k, v) for k, v in vars(self).items() if not k.startswith("_"))
        return state

    def _set_group_defaults(self, **values: Any) -> None:
        for key, value in values.items():
            self.defaults[key] = value
            for group in self.param_groups:
                group.setdefault(key, value)

    @property
    def loss_scaling(self) -> float:
        """The factor the executor multiplies the loss by (1.0: none); PopTorch's attribute."""
        groups = self.param_groups
        return float(
            groups[0].get("loss_scaling", 1.0) if groups else self.defaults["loss_scaling"]
        )

    @loss_scaling.setter
    def loss_scaling(self, value: float) -> None:
        factor = scaling("loss_scaling", value)
        self.defaults["loss_scaling"] = factor
        for group in self.param_groups:
            group["loss_scaling"] = factor

    def unscale_next_step(self, factor: float) -> None:
        """The next step's gradients carry ``factor`` (the executor's loss scaling): divide it out."""
        self._gradient_scale = float(factor)

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Unscale, clip (``max_grad_norm``), then update in PopTorch's precision."""
        loss = _evaluate(closure)
        scale, self._gradient_scale = self._gradient_scale, 1.0
        working = self._working_copies(scale)
        try:
            self._clip_gradients()
            with self._only_owned(working):
                self._update()
        finally:
            self._write_back(working)
        return loss

    def step_only(self, owned: set[int]) -> None:
        """One step that updates only the parameters whose ``id`` is in ``owned``.

        For the sharded optimizer state (:mod:`popdist_torch.optim.sharded`): unscaling and
        clipping still read every gradient, as the whole step does.
        """
        self._owned = owned
        try:
            self.step()
        finally:
            self._owned = None

    @contextlib.contextmanager
    def _only_owned(self, working: list[_Working]) -> Iterator[None]:
        """Hide the gradients of the parameters not owned from the update (then restore them)."""
        owned = self._owned
        if owned is None:
            yield
            return
        originals = {id(item.working): item.param for item in working}
        hidden = []
        for group in self.param_groups:
            for q in group["params"]:
                if id(originals.get(id(q), q)) not in owned and q.grad is not None:
                    hidden.append((q, q.grad))
                    q.grad = None
        try:
            yield
        finally:
            for q, grad in hidden:
                q.grad = grad

    def _stored_types(self) -> dict[str, torch.dtype]:
        return {key: getattr(self, attr) for key, attr in self._state_types.items()}

    def _working_copies(self, scale: float) -> list[_Working]:
        """Unscale the gradients; swap in float32 working copies where the types ask for it."""
        stored = self._stored_types()
        low_state = any(dtype != torch.float32 for dtype in stored.values())
        working: list[_Working] = []
        for group in self.param_groups:
            params = group["params"]
            for i, p in enumerate(params):
                grad = p.grad
                if grad is None:
                    continue
                if p.dtype not in _LOW_PRECISION:
                    if scale != 1.0:
                        grad.div_(scale)
                    if low_state:  # state stored in float16: the update computes in p's type
                        if p in self.state:
                            self.state[p] = _converted(self.state[p], stored, p.dtype)
                        working.append(_Working(group, i, p, p))
                    continue
                applied = grad.to(self.accum_type, copy=True)
                if scale != 1.0:
                    applied.div_(scale)
                copy = p.detach().to(torch.float32)
                copy.grad = applied.to(torch.float32)
                state = self.state.pop(p, None)
                if state:
                    self.state[copy] = _converted(state, stored, torch.float32)
                params[i] = copy
                working.append(_Working(group, i, p, copy))
        return working

    def _write_back(self, working: list[_Working]) -> None:
        """Parameters, gradients and state back from the working copies, in their types."""
        stored = self._stored_types()
        for item in working:
            p, copy = item.param, item.working
            if copy is not p:
                item.group["params"][item.index] = p
                p.copy_(copy)
                assert p.grad is not None and copy.grad is not None
                p.grad.copy_(copy.grad)
                state = self.state.pop(copy, None)
            else:
                state = self.state.get(p)
            if state:
                self.state[p] = _stored(state, stored)

    def _clip_gradients(self) -> None:
        if self.max_grad_norm is None:
            return
        grads = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        if grads:
            torch.nn.utils.clip_grad_norm_(grads, self.max_grad_norm)

    def _update(self) -> None:
        """The torch namesake's update."""
        _unhooked(self._torch_optimizer.step)(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The torch namesake, looked up by ``_update``: its ``step`` is read at call time,
        # after torch has (perhaps) wrapped it in its hook wrapper.
        torch_class = next(
            (base for base in cls.__mro__[1:] if issubclass(base, torch.optim.Optimizer)), None
        )
        if torch_class is not None:  # None: a mixin of mixins (``Moments``)
            cls._torch_optimizer = torch_class


def loss_scaling_of(optimizer: torch.optim.Optimizer | None) -> float:
    """The loss scaling the executor applies for ``optimizer`` (1.0 for torch's own)."""
    if isinstance(optimizer, PopTorchOptimizer):
        return optimizer.loss_scaling
    return 1.0


def _converted(
    state: dict[str, Any], stored: dict[str, torch.dtype], dtype: torch.dtype
) -> dict[str, Any]:
    """The typed state entries in ``dtype``, the type the update computes in."""
    return {
        key: value.to(dtype)
        if key in stored and isinstance(value, torch.Tensor) and value.is_floating_point()
        else value
        for key, value in state.items()
    }


def _stored(state: dict[str, Any], stored: dict[str, torch.dtype]) -> dict[str, Any]:
    """The typed state entries in the types the arguments name."""
    return {
        key: value.to(stored[key])
        if key in stored and isinstance(value, torch.Tensor) and value.is_floating_point()
        else value
        for key, value in state.items()
    }


def _unhooked(step: Callable[..., Any]) -> Callable[..., Any]:
    """Torch's own ``step`` without its hook wrapper: our ``step`` already runs the hooks."""
    return getattr(step, "__wrapped__", step) if getattr(step, "hooked", False) else step


def _evaluate(closure: Callable[[], float] | None) -> float | None:
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
