"""PopTorch's optimizers: torch's SGD, Adam, AdamW and RMSprop taking PopTorch's arguments.

Each class is a subclass of its torch namesake, so schedulers, ``state_dict`` and user code
treat it as one. PopTorch's extra arguments are kept where they mean something on a
float32 host, and refused with a clear error where they cannot be honoured (each is a row of
the surface table, :mod:`popdist_torch.surface.names`, owner ``optim``; a refusal is its row):

- ``loss_scaling``, ``velocity_scaling``: PopTorch multiplies the loss (the velocity) by
  this factor and divides it out again, so that float16 values neither underflow nor
  overflow. In float32 arithmetic the pair is the identity, so the update is the
  unscaled one: exactly what PopTorch computes, minus float16 rounding. The values are
  validated and kept in each param group, as PopTorch keeps them.
- ``accum_type``, ``velocity_accum_type``, ``first_order_momentum_accum_type``,
  ``second_order_momentum_accum_type``: ``torch.float32`` (the default) is what is used;
  ``torch.float16`` accumulators are refused, as no float16 state is kept here.
- ``use_combined_accum`` (SGD): PopTorch's two SGD implementations compute the same
  update; only their memory use differs, so both values are accepted.
- ``max_grad_norm``: gradients of all parameters are clipped to this global L2 norm
  before each step (``torch.nn.utils.clip_grad_norm_``).
- ``bias_correction`` (AdamW): ``False`` runs Adam's update without the bias-correction
  terms; ``True`` is torch's AdamW.
- ``use_tf_variant`` (RMSprop): only ``False`` (PyTorch's variant) is supported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, overload

import torch

from popdist_torch.errors import OptimizerError
from popdist_torch.surface.names import rows_of
from popdist_torch.surface.rows import REFUSED

__all__ = ["SGD", "Adam", "AdamW", "RMSprop"]

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


#: PopTorch's optimizer arguments, as the surface table has them (owner ``optim``).
_ARGUMENTS = {row.name: row for row in rows_of("optim")}


def _refuse_argument(name: str, value: Any) -> None:
    """Raise if the surface table refuses ``name=value``, with its row's reason."""
    row = _ARGUMENTS[name]
    if row.status == REFUSED and (row.when is None or row.when(value)):
        raise OptimizerError(f"{name}={value!r} is not supported: {row.note}")


def _check_accum_type(name: str, value: Any) -> None:
    _refuse_argument(name, value)
    if value is None or value == torch.float32:
        return
    raise OptimizerError(f"{name}={value!r} is invalid: use torch.float32 (or leave it unset)")


def _check_scaling(name: str, value: Any) -> float:
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


def _check_max_grad_norm(value: Any) -> float | None:
    if value is None or value == math.inf:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise OptimizerError(
            f"max_grad_norm={value!r} is invalid: use a positive number, or None for no clipping"
        )
    return float(value)


class _PopTorchExtras:
    """PopTorch's per-optimizer attributes shared by every class here."""

    param_groups: list[dict[str, Any]]
    defaults: dict[str, Any]
    max_grad_norm: float | None
    _torch_optimizer: type[torch.optim.Optimizer]

    def _set_group_defaults(self, **values: Any) -> None:
        for key, value in values.items():
            self.defaults[key] = value
            for group in self.param_groups:
                group.setdefault(key, value)

    def _clip_gradients(self) -> None:
        if self.max_grad_norm is None:
            return
        grads = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        if grads:
            torch.nn.utils.clip_grad_norm_(grads, self.max_grad_norm)

    @overload
    def step(self, closure: None = None) -> None: ...

    @overload
    def step(self, closure: Callable[[], float]) -> float: ...

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Clip (with ``max_grad_norm``), then the torch namesake's update."""
        loss = _evaluate(closure)
        self._clip_gradients()
        self._update()
        return loss

    def _update(self) -> None:
        """The torch namesake's update."""
        _unhooked(self._torch_optimizer.step)(self)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The torch namesake, looked up by ``_update``: its ``step`` is read at call time,
        # after torch has (perhaps) wrapped it in its hook wrapper.
        cls._torch_optimizer = next(
            base for base in cls.__bases__ if issubclass(base, torch.optim.Optimizer)
        )


class SGD(_PopTorchExtras, torch.optim.SGD):
    """``torch.optim.SGD`` with PopTorch's extra arguments (see the module docstring)."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        loss_scaling: float | None = None,
        velocity_scaling: float | None = None,
        use_combined_accum: bool | None = None,
        accum_type: torch.dtype | None = None,
        velocity_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> None:
        _check_accum_type("accum_type", accum_type)
        _check_accum_type("velocity_accum_type", velocity_accum_type)
        if use_combined_accum is not None and not isinstance(use_combined_accum, bool):
            raise OptimizerError(
                f"use_combined_accum={use_combined_accum!r} is invalid: use True or False"
            )
        scaling = _check_scaling("loss_scaling", loss_scaling)
        velocity = _check_scaling("velocity_scaling", velocity_scaling)
        self.max_grad_norm = _check_max_grad_norm(max_grad_norm)
        self.use_combined_accum = bool(use_combined_accum)
        super().__init__(params, lr, momentum, dampening, weight_decay, nesterov, **kwargs)
        self._set_group_defaults(loss_scaling=scaling, velocity_scaling=velocity)


class Adam(_PopTorchExtras, torch.optim.Adam):
    """``torch.optim.Adam`` with PopTorch's extra arguments (see the module docstring)."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        loss_scaling: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> None:
        _check_accum_type("accum_type", accum_type)
        _check_accum_type("first_order_momentum_accum_type", first_order_momentum_accum_type)
        _check_accum_type("second_order_momentum_accum_type", second_order_momentum_accum_type)
        scaling = _check_scaling("loss_scaling", loss_scaling)
        self.max_grad_norm = _check_max_grad_norm(max_grad_norm)
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **kwargs)
        self._set_group_defaults(loss_scaling=scaling)


class AdamW(_PopTorchExtras, torch.optim.AdamW):
    """``torch.optim.AdamW`` with PopTorch's extra arguments, including ``bias_correction``."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        loss_scaling: float | None = None,
        bias_correction: bool = True,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> None:
        _check_accum_type("accum_type", accum_type)
        _check_accum_type("first_order_momentum_accum_type", first_order_momentum_accum_type)
        _check_accum_type("second_order_momentum_accum_type", second_order_momentum_accum_type)
        if not isinstance(bias_correction, bool):
            raise OptimizerError(
                f"bias_correction={bias_correction!r} is invalid: use True or False"
            )
        if not bias_correction:
            fast = [
                k for k in ("foreach", "fused", "capturable", "differentiable") if kwargs.get(k)
            ]
            if fast:
                raise OptimizerError(
                    f"AdamW(bias_correction=False) does not support {fast[0]}=True: leave it unset"
                )
        scaling = _check_scaling("loss_scaling", loss_scaling)
        self.max_grad_norm = _check_max_grad_norm(max_grad_norm)
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, **kwargs)
        self._set_group_defaults(loss_scaling=scaling, bias_correction=bias_correction)

    def _update(self) -> None:
        """AdamW's update, bias-corrected (torch's) or not."""
        if all(g.get("bias_correction", True) for g in self.param_groups):
            super()._update()
            return
        for group in self.param_groups:
            if group.get("bias_correction", True):
                raise OptimizerError(
                    "AdamW param groups mix bias_correction=True and False: use one value"
                )
            self._uncorrected_step(group)

    def _uncorrected_step(self, group: dict[str, Any]) -> None:
        """Adam with decoupled weight decay and no bias correction (PopTorch's option)."""
        beta1, beta2 = group["betas"]
        lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = -p.grad if group.get("maximize", False) else p.grad
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = torch.zeros_like(
                        p, memory_format=torch.preserve_format
                    )
            state["step"] += 1
            p.mul_(1 - lr * decay)
            state["exp_avg"].lerp_(grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            second = state["exp_avg_sq"]
            if group["amsgrad"]:
                torch.maximum(state["max_exp_avg_sq"], second, out=state["max_exp_avg_sq"])
                second = state["max_exp_avg_sq"]
            p.addcdiv_(state["exp_avg"], second.sqrt().add_(eps), value=-lr)


class RMSprop(_PopTorchExtras, torch.optim.RMSprop):
    """``torch.optim.RMSprop`` with PopTorch's extra arguments (see the module docstring)."""

    def __init__(
        self,
        params: Params,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        *,
        loss_scaling: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        use_tf_variant: bool | None = None,
        max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> None:
        _check_accum_type("accum_type", accum_type)
        _check_accum_type("first_order_momentum_accum_type", first_order_momentum_accum_type)
        _check_accum_type("second_order_momentum_accum_type", second_order_momentum_accum_type)
        _refuse_argument("use_tf_variant", use_tf_variant)
        scaling = _check_scaling("loss_scaling", loss_scaling)
        self.max_grad_norm = _check_max_grad_norm(max_grad_norm)
        super().__init__(params, lr, alpha, eps, weight_decay, momentum, centered, **kwargs)
        self._set_group_defaults(loss_scaling=scaling)


def _unhooked(step: Callable[..., Any]) -> Callable[..., Any]:
    """Torch's own ``step`` without its hook wrapper: our ``step`` already runs the hooks."""
    return getattr(step, "__wrapped__", step) if getattr(step, "hooked", False) else step


def _evaluate(closure: Callable[[], float] | None) -> float | None:
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
