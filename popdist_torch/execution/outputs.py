"""Collect a call's per-micro-batch outputs into what ``OutputMode`` returns.

Every micro-step yields the model's outputs (a pytree of tensors) with a leading
replica dimension ``[R, *S]``.  The collector keeps only what the mode needs and, at the
end of the call, lays the kept outputs out as PopTorch does: the ``K`` kept copies of a
per-replica output of shape ``S`` become ``[K * S[0], *S[1:]]`` (batched outputs are
concatenated along dim 0) or ``[K]`` for a scalar (a single scalar when ``K == 1``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from popdist_torch.enums import OutputMode
from popdist_torch.errors import ExecutorError, ExecutorStateError

__all__ = ["OneReplica", "OutputCollector", "layout"]


class OneReplica:
    """One replica's outputs with no replica dimension yet (leaves shaped ``S``).

    A single local replica's micro-step gives these: the collector lays them out without
    stacking them into ``[1, *S]`` first (for one kept step they are returned as they are,
    which is what stacking and laying out would give).
    """

    __slots__ = ("outputs",)

    def __init__(self, outputs: Any) -> None:
        self.outputs = outputs


def layout(stacked: torch.Tensor) -> torch.Tensor:
    """``[K, *S]`` → ``[K*S0, *S[1:]]``; scalars (``S == ()``) → ``[K]``, or ``[]`` if K is 1."""
    if stacked.dim() == 1:
        return stacked[0] if stacked.shape[0] == 1 else stacked
    return stacked.reshape(stacked.shape[0] * stacked.shape[1], *stacked.shape[2:])


class OutputCollector:
    """Accumulates per-micro-step outputs for one call, by output mode.

    ``num_iterations`` device iterations of ``steps_per_iteration`` micro-steps each;
    ``period`` is N of ``EveryN``.
    """

    def __init__(
        self, mode: OutputMode, num_iterations: int, steps_per_iteration: int, period: int
    ) -> None:
        if mode == OutputMode.Default:
            raise ExecutorError("OutputMode.Default must be resolved before collecting outputs")
        self.mode = mode
        self.num_iterations = num_iterations
        self.steps = steps_per_iteration
        self.period = period
        self._kept: list[Any] = []
        self._sum: Any = None
        self._single = False  # the kept outputs are OneReplica's (leaves S, not [1, *S])

    def wants(self, iteration: int, step: int) -> bool:
        """Whether the outputs of this micro-step are kept (skip copying them otherwise)."""
        if self.mode in (OutputMode.All, OutputMode.Sum):
            return True
        if self.mode == OutputMode.Final:
            return iteration == self.num_iterations - 1 and step == self.steps - 1
        return (iteration + 1) % self.period == 0  # EveryN: whole device iterations

    def add(self, iteration: int, step: int, outputs: Any) -> None:
        """Record one micro-step's outputs (leaves shaped ``[R, *S]``, or a
        :class:`OneReplica`; already detached)."""
        if not self.wants(iteration, step):
            return
        if isinstance(outputs, OneReplica):
            self._single, outputs = True, outputs.outputs
        if self.mode == OutputMode.Sum:
            self._sum = outputs if self._sum is None else tree_map(torch.add, self._sum, outputs)
        else:
            self._kept.append(outputs)

    def result(self) -> Any:
        """The call's return value, laid out as PopTorch returns it."""
        kept = [self._sum] if self.mode == OutputMode.Sum else self._kept
        if not kept:
            raise ExecutorStateError("no outputs were recorded for this call")
        if self._single:
            if len(kept) == 1:  # [1, *S] laid out is S (a scalar stays one): as they are
                return kept[0]
            kept = [tree_map(lambda t: t.unsqueeze(0), k) for k in kept]
        if len(kept) == 1:  # Final, or one kept step: no concatenation, and often no pytree walk
            only = kept[0]
            if isinstance(only, torch.Tensor):
                return layout(only)
            if type(only) in (tuple, list) and all(isinstance(t, torch.Tensor) for t in only):
                return type(only)(layout(t) for t in only)
        flat = [tree_flatten(k) for k in kept]
        spec = flat[0][1]
        columns = zip(*(leaves for leaves, _ in flat), strict=True)
        merged = [layout(col[0] if len(col) == 1 else torch.cat(col, dim=0)) for col in columns]
        return tree_unflatten(merged, spec)
