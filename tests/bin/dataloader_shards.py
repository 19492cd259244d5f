"""Graphcore-style DataLoader use under poprun/mpirun: ``dataloader_shards.py popdist|plain``.

Prints one JSON line per instance: CIFAR-10-sized loader length and combined batch size,
and the sample indices of two shuffled epochs of a small dataset.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import torch

import popdist
import popdist.poptorch
import popdist_torch as poptorch


class Indices(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


def options(kind: str) -> poptorch.Options:
    opts = popdist.poptorch.Options() if kind == "popdist" else poptorch.Options()
    return opts.randomSeed(7)


def main() -> None:
    kind = sys.argv[1]
    cifar = poptorch.DataLoader(options(kind), Indices(50_000), batch_size=32, shuffle=True)
    small = poptorch.DataLoader(
        options(kind), Indices(100), batch_size=2, shuffle=True, mode=poptorch.DataLoaderMode.Async
    )
    epochs = [[i for b in small for i in b.tolist()] for _ in range(2)]
    small.terminate()
    popdist.init()  # the DataLoader needs no collectives; the backend must not disturb it
    report = {
        "backend": popdist.collectives.active(),
        "instance": popdist.getInstanceIndex(),
        "processes": cifar.options.Distributed.numProcesses,
        "len": len(cifar),
        "combined": cifar.combinedBatchSize,
        "small_combined": small.combinedBatchSize,
        "epochs": epochs,
    }
    if len(sys.argv) > 2:  # a file of its own: plain mpirun may split a long line among others
        out = pathlib.Path(sys.argv[2]) / f"report-{os.getpid()}.json"
        out.write_text(json.dumps(report))
    else:
        print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
