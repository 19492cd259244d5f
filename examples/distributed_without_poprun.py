"""Distributed training without poprun: any launcher, process id and count set by hand.

    mpirun -np 2 python examples/distributed_without_poprun.py

(The PopTorch guide's "distributed execution without PopRun" recipe.)  The only change to
a single-process script is ``Options.Distributed.configureProcessId(id, count)``; the
replication factor stays the number of *local* replicas.  The DataLoader gives each
process its own part of the dataset; with ``shuffle=True`` every process needs the same
``randomSeed``.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import popdist_torch as poptorch


class RandomPairs(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``length`` samples of shape ``shape`` with a label each, reproducible by index."""

    def __init__(self, shape: tuple[int, ...], length: int) -> None:
        self.shape, self.length = shape, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(index)
        x = torch.randn(self.shape, generator=gen)
        return x, (x.sum() > 0).long()


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc(x.flatten(1))
        return out, F.cross_entropy(out, y)


def process(process_id: int = 0, num_processes: int = 1) -> None:
    opts = poptorch.Options()
    opts.deviceIterations(10)  # ten weight updates per call
    opts.replicationFactor(2)  # two replicas in this process
    opts.Distributed.configureProcessId(process_id, num_processes)
    opts.Training.gradientAccumulation(4)
    opts.randomSeed(42)  # the same shuffling everywhere

    micro_batch = 2
    data = poptorch.DataLoader(
        opts, RandomPairs(shape=(3, 2), length=4000), batch_size=micro_batch, shuffle=True
    )
    model = poptorch.trainingModel(Model(), options=opts)
    for number, (x, y) in enumerate(data):
        # One call: 10 updates x 4 accumulation steps x 2 replicas x 2 samples = 160.
        # ``output`` and ``loss`` are those of the last micro-batch of each replica.
        output, loss = model(x, y)
        if number % 5 == 0:
            print(
                f"process {process_id}: call {number}, combined batch {tuple(x.shape)}, "
                f"output {tuple(output.shape)}, loss per replica {loss.numpy().round(3)}"
            )


if __name__ == "__main__":
    process(
        int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")),
        int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")),
    )
