"""PopTorch's ``poptorch.profiling``: host-side trace points, kept as no-ops.

PopTorch writes them into a PopVision System Analyser trace; here there is no such
trace, so ``Channel`` returns what it instruments unchanged and its trace points time
nothing.  Use ``torch.profiler`` (or ``popdist_torch.pipeline.record_schedule``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TypeVar

__all__ = ["Channel"]

_T = TypeVar("_T")


class Channel:
    """A named group of trace points (no-op here)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def instrument(self, obj: _T, *methods: str) -> _T:
        """Return ``obj`` unchanged (PopTorch wraps ``methods`` in trace points)."""
        return obj

    @contextlib.contextmanager
    def tracepoint(self, name: str) -> Iterator[None]:
        """A trace point around the ``with`` body; records nothing here."""
        yield
