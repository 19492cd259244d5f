"""``opts.Precision``: half-precision forward passes (``torch.autocast``)."""

from __future__ import annotations

from typing import Any

from popdist_torch.errors import OptionsError
from popdist_torch.options.group import OptionGroup, install_setters

__all__ = ["PrecisionOptions"]


@install_setters
class PrecisionOptions(OptionGroup):
    """``opts.Precision``: whether and in which half type forward passes autocast."""

    _owner = "Options.Precision"

    def __init__(self) -> None:
        super().__init__()
        self._autocast = False
        self._autocast_dtype = "bfloat16"  # a name: this module does not import torch

    @property
    def autocast_enabled(self) -> bool:
        """Whether forward passes run under ``torch.autocast`` (half precision)."""
        return self._autocast

    @property
    def autocast_dtype(self) -> str:
        """The half type autocast computes in: ``"bfloat16"`` (default) or ``"float16"``."""
        return self._autocast_dtype

    def autocastEnabled(self, enabled: bool, dtype: Any = None) -> PrecisionOptions:
        """Run the model's forward passes under ``torch.autocast`` on the instance's device.

        PopTorch's automatic half-precision casting. ``dtype`` is ``torch.bfloat16`` (the
        default: no loss scaling needed) or ``torch.float16``; weights, gradients and the
        optimizer stay in float32. ``torch.autocast`` has no effect inside ``vmap``, so
        with it the local replicas run one after the other.
        """
        self._check_mutable("autocastEnabled")
        if dtype is not None:
            name = str(dtype).removeprefix("torch.")
            if name not in ("bfloat16", "float16", "half"):
                raise OptionsError(
                    f"Precision.autocastEnabled(dtype={dtype!r}): expected torch.bfloat16 or "
                    f"torch.float16"
                )
            self._autocast_dtype = "float16" if name == "half" else name
        self._autocast = bool(enabled)
        return self

    def _values(self) -> dict[str, Any]:
        return {"autocast": self._autocast, "autocast_dtype": self._autocast_dtype}
