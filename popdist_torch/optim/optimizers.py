"""PopTorch's SGD, Adam, AdamW and RMSprop: torch's namesakes with PopTorch's arguments.

Each class is a subclass of its torch namesake (schedulers, ``state_dict`` and user code
treat it as one) and of :class:`~popdist_torch.optim.base.PopTorchOptimizer` (precision,
loss scaling, clipping). The update is torch's, except AdamW without bias correction and
RMSprop's TensorFlow variant, which torch does not have.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from popdist_torch.errors import OptimizerError
from popdist_torch.optim.base import (
    Params,
    PopTorchOptimizer,
    flag,
    given,
    or_default,
    scaling,
    torch_keywords,
)
from popdist_torch.optim.base import accum_type as _accum
from popdist_torch.optim.base import max_grad_norm as _max_grad_norm

__all__ = ["SGD", "Adam", "AdamW", "RMSprop"]

ADAM_STATE = {
    "exp_avg": "first_order_momentum_accum_type",
    "exp_avg_sq": "second_order_momentum_accum_type",
    "max_exp_avg_sq": "second_order_momentum_accum_type",
}


def _adam_defaults(
    lr: Any, betas: Any, eps: Any, weight_decay: Any, amsgrad: Any, decay: float
) -> tuple[Any, ...]:
    """The Adam family's positional arguments, ``None`` read as torch's default."""
    return (
        or_default(lr, 1e-3),
        or_default(betas, (0.9, 0.999)),
        or_default(eps, 1e-8),
        or_default(weight_decay, decay),
        or_default(amsgrad, False),
    )


class Moments(PopTorchOptimizer):
    """The three type arguments of the Adam family, RMSprop and LAMB."""

    first_order_momentum_accum_type: torch.dtype
    second_order_momentum_accum_type: torch.dtype

    def _set_types(self, accum: Any, first: Any, second: Any) -> None:
        self.accum_type = _accum("accum_type", accum)
        self.first_order_momentum_accum_type = _accum("first_order_momentum_accum_type", first)
        self.second_order_momentum_accum_type = _accum("second_order_momentum_accum_type", second)


class SGD(PopTorchOptimizer, torch.optim.SGD):
    """``torch.optim.SGD`` with PopTorch's arguments (see :mod:`popdist_torch.optim`)."""

    _state_types: ClassVar[dict[str, str]] = {"momentum_buffer": "velocity_accum_type"}

    def __init__(
        self,
        params: Params,
        lr: float | None = None,
        momentum: float | None = None,
        dampening: float | None = None,
        weight_decay: float | None = None,
        nesterov: bool | None = None,
        *,
        loss_scaling: float | None = None,
        velocity_scaling: float | None = None,
        use_combined_accum: bool | None = None,
        accum_type: torch.dtype | None = None,
        velocity_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> None:
        passed = given({**locals(), **kwargs})
        self.accum_type = _accum("accum_type", accum_type)
        self.velocity_accum_type = _accum("velocity_accum_type", velocity_accum_type)
        self.use_combined_accum = flag("use_combined_accum", use_combined_accum, False)
        factor = scaling("loss_scaling", loss_scaling)
        velocity = scaling("velocity_scaling", velocity_scaling)
        self.max_grad_norm = _max_grad_norm(max_grad_norm)
        super().__init__(
            params,
            or_default(lr, 1e-3),
            or_default(momentum, 0.0),
            or_default(dampening, 0.0),
            or_default(weight_decay, 0.0),
            or_default(nesterov, False),
            **torch_keywords(kwargs),
        )
        self._set_group_defaults(loss_scaling=factor, velocity_scaling=velocity)
        self._track_variables(passed)


class Adam(Moments, torch.optim.Adam):
    """``torch.optim.Adam`` with PopTorch's arguments (see :mod:`popdist_torch.optim`)."""

    _state_types = ADAM_STATE

    def __init__(
        self,
        params: Params,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        amsgrad: bool | None = None,
        *,
        loss_scaling: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> None:
        passed = given({**locals(), **kwargs})
        self._set_types(
            accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type
        )
        factor = scaling("loss_scaling", loss_scaling)
        self.max_grad_norm = _max_grad_norm(max_grad_norm)
        super().__init__(
            params,
            *_adam_defaults(lr, betas, eps, weight_decay, amsgrad, 0.0),
            **torch_keywords(kwargs),
        )
        self._set_group_defaults(loss_scaling=factor)
        self._track_variables(passed)


class AdamW(Moments, torch.optim.AdamW):
    """``torch.optim.AdamW`` with PopTorch's arguments, including ``bias_correction``."""

    _state_types = ADAM_STATE

    def __init__(
        self,
        params: Params,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        amsgrad: bool | None = None,
        *,
        loss_scaling: float | None = None,
        bias_correction: bool | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> None:
        passed = given({**locals(), **kwargs})
        self._set_types(
            accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type
        )
        corrected = flag("bias_correction", bias_correction, True)
        if not corrected:
            fast = [
                k for k in ("foreach", "fused", "capturable", "differentiable") if kwargs.get(k)
            ]
            if fast:
                raise OptimizerError(
                    f"AdamW(bias_correction=False) does not support {fast[0]}=True: leave it unset"
                )
        factor = scaling("loss_scaling", loss_scaling)
        self.max_grad_norm = _max_grad_norm(max_grad_norm)
        super().__init__(
            params,
            *_adam_defaults(lr, betas, eps, weight_decay, amsgrad, 1e-2),
            **torch_keywords(kwargs),
        )
        self._set_group_defaults(loss_scaling=factor, bias_correction=corrected)
        self._track_variables(passed)

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


class RMSprop(Moments, torch.optim.RMSprop):
    """``torch.optim.RMSprop`` with PopTorch's arguments, including ``use_tf_variant``.

    ``use_tf_variant=True`` is TensorFlow's RMSprop, as PopTorch documents it: the mean
    square starts at one instead of zero, ``eps`` is added inside the square root, and
    with momentum the learning rate is folded into the momentum buffer.
    """

    _state_types: ClassVar[dict[str, str]] = {
        "momentum_buffer": "first_order_momentum_accum_type",
        "grad_avg": "first_order_momentum_accum_type",
        "square_avg": "second_order_momentum_accum_type",
    }

    def __init__(
        self,
        params: Params,
        lr: float | None = None,
        alpha: float | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        momentum: float | None = None,
        centered: bool | None = None,
        *,
        loss_scaling: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
        use_tf_variant: bool | None = None,
        max_grad_norm: float | None = None,
        **kwargs: Any,
    ) -> None:
        passed = given({**locals(), **kwargs})
        self._set_types(
            accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type
        )
        self.use_tf_variant = flag("use_tf_variant", use_tf_variant, False)
        factor = scaling("loss_scaling", loss_scaling)
        self.max_grad_norm = _max_grad_norm(max_grad_norm)
        super().__init__(
            params,
            or_default(lr, 1e-2),
            or_default(alpha, 0.99),
            or_default(eps, 1e-8),
            or_default(weight_decay, 0.0),
            or_default(momentum, 0.0),
            or_default(centered, False),
            **torch_keywords(kwargs),
        )
        self._set_group_defaults(loss_scaling=factor, use_tf_variant=self.use_tf_variant)
        self._track_variables(passed)

    def _update(self) -> None:
        if not self.use_tf_variant:
            super()._update()
            return
        for group in self.param_groups:
            self._tf_step(group)

    def _tf_step(self, group: dict[str, Any]) -> None:
        """TensorFlow's RMSprop on one param group."""
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        decay, momentum, centered = group["weight_decay"], group["momentum"], group["centered"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = -p.grad if group.get("maximize", False) else p.grad
            if decay:
                grad = grad.add(p, alpha=decay)
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
                if momentum > 0:
                    state["momentum_buffer"] = torch.zeros_like(p)
                if centered:
                    state["grad_avg"] = torch.zeros_like(p)
            state["step"] += 1
            square = state["square_avg"]
            square.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
            if centered:
                mean = state["grad_avg"]
                mean.lerp_(grad, 1 - alpha)
                denom = square.addcmul(mean, mean, value=-1).add_(eps).sqrt_()
            else:
                denom = square.add(eps).sqrt_()
            if momentum > 0:
                buf = state["momentum_buffer"]
                buf.mul_(momentum).addcdiv_(grad, denom, value=lr)
                p.sub_(buf)
            else:
                p.addcdiv_(grad, denom, value=-lr)
