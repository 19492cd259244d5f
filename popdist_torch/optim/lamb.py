"""PopTorch's LAMB: layer-wise adaptive moments (You et al., "Large Batch Optimization for
Deep Learning: Training BERT in 76 minutes", arXiv:1904.00962), which torch does not have.

Per parameter tensor: Adam's moments (bias-corrected unless ``bias_correction=False``) give
the direction ``u = m / (sqrt(v) + eps) + weight_decay * w``; the step is scaled by the
trust ratio ``phi(||w||) / ||u||``, with ``phi(z) = min(z, max_weight_norm)`` (PopTorch's
scaling function; 65500, the float16 maximum, by default) and a ratio of 1 when either norm
is zero: ``w -= lr * trust * u``.
"""

from __future__ import annotations

from typing import Any

import torch

from popdist_torch.errors import OptimizerError
from popdist_torch.optim.base import Params, flag, given, or_default, scaling
from popdist_torch.optim.optimizers import ADAM_STATE, Moments

__all__ = ["LAMB"]

#: PopTorch's default ``max_weight_norm``: about the float16 maximum.
MAX_WEIGHT_NORM = 65500.0


def _trust(p: torch.Tensor, direction: torch.Tensor, limit: float) -> torch.Tensor:
    """The trust ratio ``min(||w||, limit) / ||u||`` (1 where either norm is 0 or the ratio is
    not finite), as a 0-dim tensor on the parameter's device: no host round trip per
    parameter (on a GPU, ``float(norm)`` waits for the device every time)."""
    weight_norm = p.norm().clamp_(max=limit)
    direction_norm = direction.norm()
    ratio = weight_norm / direction_norm
    usable = (weight_norm > 0) & (direction_norm > 0) & ratio.isfinite()
    return torch.where(usable, ratio, torch.ones_like(ratio))


class LAMB(Moments, torch.optim.Optimizer):
    """PopTorch's ``poptorch.optim.LAMB`` (see the module docstring)."""

    _state_types = ADAM_STATE

    def __init__(
        self,
        params: Params,
        lr: float | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        bias_correction: bool | None = None,
        loss_scaling: float | None = None,
        max_weight_norm: float | None = None,
        accum_type: torch.dtype | None = None,
        first_order_momentum_accum_type: torch.dtype | None = None,
        second_order_momentum_accum_type: torch.dtype | None = None,
    ) -> None:
        passed = given(locals())
        self._set_types(
            accum_type, first_order_momentum_accum_type, second_order_momentum_accum_type
        )
        self.bias_correction = flag("bias_correction", bias_correction, True)
        norm = MAX_WEIGHT_NORM if max_weight_norm is None else max_weight_norm
        if isinstance(norm, bool) or not isinstance(norm, (int, float)) or not norm > 0:
            raise OptimizerError(
                f"max_weight_norm={max_weight_norm!r} is invalid: use a positive number "
                f"(math.inf: no limit; None: {MAX_WEIGHT_NORM})"
            )
        self.max_weight_norm = float(norm)
        self.max_grad_norm = None
        factor = scaling("loss_scaling", loss_scaling)
        defaults = {
            "lr": or_default(lr, 1e-3),
            "betas": or_default(betas, (0.9, 0.999)),
            "eps": or_default(eps, 1e-8),
            "weight_decay": or_default(weight_decay, 1e-2),
            "max_weight_norm": self.max_weight_norm,
        }
        super().__init__(params, defaults)
        self._set_group_defaults(loss_scaling=factor, bias_correction=self.bias_correction)
        self._track_variables(passed)

    def _update(self) -> None:
        for group in self.param_groups:
            self._group_step(group)

    def _group_step(self, group: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
        limit = group["max_weight_norm"]
        corrected = group.get("bias_correction", self.bias_correction)
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            step = float(state["step"])
            m, v = state["exp_avg"], state["exp_avg_sq"]
            m.lerp_(p.grad, 1 - beta1)
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            first = 1 - beta1**step if corrected else 1.0
            second = 1 - beta2**step if corrected else 1.0
            direction = (m / first) / (v / second).sqrt_().add_(eps)
            if decay:
                direction.add_(p, alpha=decay)
            p.sub_(direction.mul_(_trust(p, direction, limit).mul_(lr)))
