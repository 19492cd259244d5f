"""A PopTorch program's loaders as optimum-graphcore's trainer builds them, under poprun.

``poprun --poptorch-modules --num-instances N python sampler_shards.py``: ``import poptorch``
answers with the project's; each instance prints one JSON line with two epochs of each
loader (a RandomSampler for training, a SequentialSampler for evaluation, a user's own
sampler), each epoch the list of its batches' sample indices.
"""

from __future__ import annotations

import json

import poptorch
import torch
from torch.utils.data import Dataset, RandomSampler, Sampler, SequentialSampler

import popdist

SAMPLES = 50
SEED = 42


class Indices(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


class Reversed(Sampler):  # type: ignore[type-arg]
    """A user's own sampler."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


def main() -> None:
    opts = poptorch.Options()  # PopTorch's own: the instance and count come from poprun
    opts.randomSeed(SEED)
    dataset = Indices()
    samplers = {
        "random": RandomSampler(dataset),
        "sequential": SequentialSampler(dataset),
        "own": Reversed(SAMPLES),
    }
    report: dict[str, object] = {"instance": popdist.getInstanceIndex()}
    for name, sampler in samplers.items():
        loader = poptorch.DataLoader(
            opts,
            dataset,
            batch_size=2,
            sampler=sampler,
            auto_distributed_partitioning=True,
            mode=poptorch.DataLoaderMode.Sync,
        )
        report[name] = [[b.tolist() for b in loader] for _ in range(2)]
    print("SHARDS " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
