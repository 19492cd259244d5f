"""Synthetic data (``Options.enableSyntheticData(True)``) and the throughput it measures.

PopTorch's synthetic data is generated on the device (``RandomNormal``: standard-normal
values) so that a run measures the model without host I/O. Here the executor replaces the
inputs of each call by generated tensors of the same shapes and types, made once on the
instance's device and reused (no host-to-device copy after the first call), and a
``DataLoader`` yields generated batches after reading one sample for their shapes
(:mod:`popdist_torch.data.loader`). Floating-point tensors are standard normal; integer and
boolean tensors are zeros, a valid class index or embedding row, where normal values cast
to integers would be out of range.

:class:`Throughput` counts a wrapped model's samples and wall time per call; a synthetic
run prints its figure when the model is destroyed or the program ends.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["SyntheticInputs", "Throughput", "generated"]


def generated(
    like: torch.Tensor, shape: tuple[int, ...] | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """A synthetic tensor of ``like``'s type (and shape, unless ``shape`` is given)."""
    size = tuple(like.shape) if shape is None else shape
    where = like.device if device is None else device
    if like.is_floating_point() or like.is_complex():
        return torch.randn(size, dtype=like.dtype, device=where)
    return torch.zeros(size, dtype=like.dtype, device=where)


class SyntheticInputs:
    """A call's inputs replaced by generated tensors of the same shapes and types."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._made: dict[tuple[int, tuple[int, ...], torch.dtype], torch.Tensor] = {}

    def replace(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        leaves, spec = tree_flatten((args, kwargs))
        out = [
            self._like(i, leaf) if isinstance(leaf, torch.Tensor) else leaf
            for i, leaf in enumerate(leaves)
        ]
        new_args, new_kwargs = tree_unflatten(out, spec)
        return tuple(new_args), dict(new_kwargs)

    def _like(self, index: int, tensor: torch.Tensor) -> torch.Tensor:
        key = (index, tuple(tensor.shape), tensor.dtype)
        made = self._made.get(key)
        if made is None:
            made = self._made[key] = generated(tensor, device=self._device)
        return made


class Throughput:
    """Samples and wall time of a wrapped model's calls; the first call is set-up."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.calls = 0
        self.samples = 0
        self.seconds = 0.0
        self.first: tuple[int, float] | None = None
        self.reported = False

    def add(self, samples: int, seconds: float) -> None:
        self.calls += 1
        if self.first is None:
            self.first = (samples, seconds)
            return
        self.samples += samples
        self.seconds += seconds

    def figures(self) -> dict[str, float]:
        """``samples``, ``seconds`` and ``samples_per_second``, from the second call on (the
        first call includes the model's one-time set-up) or of the first if it is the only one."""
        samples, seconds = self.samples, self.seconds
        if self.calls == 1 and self.first is not None:
            samples, seconds = self.first
        rate = samples / seconds if seconds > 0 else 0.0
        return {
            "calls": self.calls,
            "samples": samples,
            "seconds": seconds,
            "samples_per_second": rate,
        }

    def report(self) -> None:
        """Print the figure once (stderr), if any call ran."""
        if self.reported or not self.calls:
            return
        self.reported = True
        f = self.figures()
        print(
            f"popdist_torch: {self.label}: {f['samples_per_second']:.1f} samples/s "
            f"({int(f['samples'])} samples in {f['seconds']:.3f} s over {self.calls} call(s))",
            file=sys.stderr,
            flush=True,
        )


def now() -> float:
    return time.perf_counter()
