"""What ``tests/bin/elastic_train.py`` leaves in its directory, read back for the elastic tests
of the multi-host and Slurm tiers: the samples each step trained, and the final weights."""

from __future__ import annotations

import collections
from pathlib import Path

import torch


def samples(directory: Path) -> dict[int, collections.Counter[int]]:
    """Each step's sample indices, from the newest generation that trained it."""
    newest: dict[int, tuple[int, list[int]]] = {}
    for path in (directory / "log").glob("*.g*"):
        for line in path.read_text().splitlines():
            step, generation, indices = line.split()
            key, gen = int(step), int(generation)
            if key not in newest or gen > newest[key][0]:
                newest[key] = (gen, [])
            if gen == newest[key][0]:
                newest[key][1].extend(int(i) for i in indices.split(","))
    return {step: collections.Counter(found) for step, (_, found) in newest.items()}


def weights(directory: Path) -> dict[str, torch.Tensor]:
    """Instance 0's final weights."""
    state: dict[str, torch.Tensor] = torch.load(directory / "final.0.pt", weights_only=True)
    return state
