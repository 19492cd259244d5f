"""Stand-ins the unit tier drives poprun's pure parts with: a clock that moves only when
told, and the instances of a run."""

from __future__ import annotations

from poprun.run.verdict import InstanceResult


class Clock:
    """A clock that moves only when told (``clock.t`` may also be set)."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def instances(n: int = 2, host: str = "localhost") -> tuple[InstanceResult, ...]:
    """``n`` instances on ``host``, indices 0.., pids 100.."""
    return tuple(InstanceResult(index=i, host=host, pid=100 + i) for i in range(n))
