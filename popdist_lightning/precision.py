"""``IPUPrecision``: float32, with backward and the optimizer step left to the executor.

popdist_torch's ``trainingModel`` runs forward, backward and the optimizer step inside one
call, so Lightning's backward must do nothing (the loss it sees is detached) and its
optimizer step only runs the closure (which calls the executor).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.plugins.precision import Precision
from torch import Tensor
from torch.optim import Optimizer

__all__ = ["IPUPrecision"]


class IPUPrecision(Precision):
    """32-bit precision for the IPU strategy (the executor does backward and step)."""

    precision = "32-true"

    def backward(
        self, tensor: Tensor, model: Any, optimizer: Any, *args: Any, **kwargs: Any
    ) -> None:
        """No-op: the executor already ran backward for this step."""

    def optimizer_step(  # type: ignore[override]
        self, optimizer: Optimizer, model: Any, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        """Run the closure (the executor call: forward, backward, step); no second step."""
        return closure()

    def clip_gradients(self, *args: Any, **kwargs: Any) -> None:
        """Unreachable: the strategy rejects gradient clipping before training starts."""
