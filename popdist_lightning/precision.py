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

from popdist_lightning.errors import IPUStrategyError

__all__ = ["IPUPrecision", "as_ipu_precision"]


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


def as_ipu_precision(plugin: Precision | None) -> Precision | None:
    """The plugin IPUStrategy keeps for ``plugin``: Lightning's plain float32 one becomes
    :class:`IPUPrecision`; any other precision is refused (the executor trains in float32)."""
    if plugin is None or isinstance(plugin, IPUPrecision):
        return plugin
    if type(plugin) is not Precision:
        raise IPUStrategyError(
            f"precision plugin {type(plugin).__name__} is not supported by IPUStrategy: it "
            f"trains in float32 (leave Trainer(precision=...) at its default)"
        )
    return IPUPrecision()
