"""``getLatency()``: the round-trip latency of each device iteration of the last call.

PopTorch's ``getLatency()`` returns ``(min, max, mean)``, in fractional seconds, of the
time between a device iteration's first input being requested and its last output being
written back to the host, over the iterations of the model's latest call; inference
benchmarks call it after every batch. Here every device iteration runs on the host (or
the instance's GPU), so its round trip is the host-side time from the moment it starts
reading its micro-batches to the moment its outputs are kept (and, training, the
optimizer has stepped): :class:`Latency` measures exactly that, with
``time.perf_counter``, while the executor walks the iterations.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

__all__ = ["Latency"]


class Latency:
    """The executor's latency clock (a mixin): :meth:`_timed` walks and times the iterations."""

    _latencies: tuple[float, ...] = ()

    def _timed(self, iterations: int) -> Iterator[int]:
        """``range(iterations)``, timing each iteration from its start to the next request.

        The figures of a call replace the last call's when the call has run all its
        iterations; a call that raised leaves the last complete call's figures.
        """
        durations: list[float] = []
        for d in range(iterations):
            started = time.perf_counter()
            yield d
            durations.append(time.perf_counter() - started)
        self._latencies = tuple(durations)

    def getLatency(self) -> tuple[float, float, float]:
        """``(min, max, mean)`` round-trip seconds of the last call's device iterations.

        ``(0.0, 0.0, 0.0)`` before the model has run, as PopTorch's when it has no figures.
        """
        figures = self._latencies
        if not figures:
            return (0.0, 0.0, 0.0)
        return (min(figures), max(figures), sum(figures) / len(figures))
