"""The options that decide what a run shows and reads: anchored tensors and synthetic data.

``anchorTensor(short_name, long_name, output_mode=None, output_return_period=1)`` asks the
executor to keep a tensor that the model does not return (PopTorch's *anchor*), read back
with ``model.getAnchoredTensor(short_name)``: a parameter's gradient
(``"Gradient___fc.weight"``), its value after the update (``"UpdatedVar___fc.weight"``, or
``"fc.weight"``), a buffer, or a submodule's output (``"Output___fc"``); the names a model
has are ``model.getTensorNames()`` (:mod:`popdist_torch.execution.anchors`).

``enableSyntheticData(True)`` runs without host I/O: a ``DataLoader`` reads one sample to
learn the shapes and then yields generated batches, and the executor feeds the model
generated tensors of the shapes and types of the inputs it is given, kept on the device
(PopTorch's ``RandomNormal`` synthetic data: standard-normal floating point; integer and
boolean inputs are zeros, a valid class index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from popdist_torch.enums import OutputMode
from popdist_torch.errors import OptionsError
from popdist_torch.options.group import OptionGroup
from popdist_torch.surface.rows import whole_number

__all__ = ["AnchorRequest", "ObservingOptions"]


@dataclass(frozen=True)
class AnchorRequest:
    """One ``anchorTensor`` call: the tensor ``long_name``, read back as ``short_name``.

    ``output_mode`` ``None``: the model's output mode.
    """

    short_name: str
    long_name: str
    output_mode: OutputMode | None
    output_return_period: int


class ObservingOptions(OptionGroup):
    """``anchorTensor`` and ``enableSyntheticData`` (a base of ``Options``)."""

    _anchors: tuple[AnchorRequest, ...] = ()
    _synthetic_data: bool = False

    @property
    def anchored_tensors(self) -> tuple[AnchorRequest, ...]:
        """The ``anchorTensor`` requests, in the order they were made."""
        return self._anchors

    @property
    def synthetic_data(self) -> bool:
        """Whether runs use generated data instead of reading any (``enableSyntheticData``)."""
        return self._synthetic_data

    def anchorTensor(
        self,
        short_name: str,
        long_name: str,
        output_mode: OutputMode | None = None,
        output_return_period: int | None = 1,
    ) -> Any:
        """Keep tensor ``long_name`` after each call, read back as ``short_name``."""
        self._check_mutable("anchorTensor")
        for name, value in (("short_name", short_name), ("long_name", long_name)):
            if not isinstance(value, str) or not value:
                raise OptionsError(f"anchorTensor({name}={value!r}): expected a non-empty string")
        mode = None
        period = 1
        if output_mode is not None:
            try:
                mode = OutputMode(output_mode)
            except ValueError:
                raise OptionsError(
                    f"anchorTensor(output_mode={output_mode!r}): expected an OutputMode "
                    f"({', '.join(m.name for m in OutputMode)}) or None"
                ) from None
            if mode == OutputMode.EveryN:
                period = whole_number("anchorTensor(output_return_period)", output_return_period)
        kept = [a for a in self._anchors if a.short_name != short_name]
        self._anchors = (*kept, AnchorRequest(short_name, long_name, mode, period))
        return self

    def enableSyntheticData(self, enabled: bool) -> Any:
        """Run without host I/O on generated data (``True``), or on real data (``False``)."""
        self._check_mutable("enableSyntheticData")
        self._synthetic_data = bool(enabled)
        return self

    def _observing_values(self) -> dict[str, Any]:
        return {
            "anchored_tensors": {
                a.short_name: [a.long_name, a.output_mode, a.output_return_period]
                for a in self._anchors
            },
            "synthetic_data": self._synthetic_data,
        }
