"""Train under poprun, checkpointing and resuming: ``ckpt_resume.py PHASE DIR``.

PHASE ``full`` trains N steps, saves a checkpoint and the weights of that moment
(``DIR/first.<instance>.pt``), and trains M more; ``resume`` loads the checkpoint in a new
launch and trains M steps. Each instance writes its final weights to
``DIR/<phase>.<instance>.pt`` (resume and full must match exactly).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

import popdist
import popdist.poptorch
import popdist_torch as poptorch
from popdist_torch.checkpoint import load_checkpoint, save_checkpoint

N, M = 5, 6  # the save falls mid-epoch (6 steps per epoch); the resumed run crosses an epoch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.body(x)
        return out, nn.functional.mse_loss(out, y)


def data() -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(96, 4, generator=gen)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())


def batches(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader  # every pass is a new epoch


def setup() -> tuple[Net, Any, Any, Any]:
    """``popdist.init()``, then the model, options, optimizer and loader both scripts train."""
    popdist.init()
    torch.manual_seed(0)
    model = Net()
    opts = popdist.poptorch.Options()
    opts.randomSeed(42)
    opts.deviceIterations(2)
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=0.01)
    loader = poptorch.DataLoader(opts, data(), batch_size=2, shuffle=True)
    return model, opts, optimizer, loader


def main() -> None:
    phase, directory = sys.argv[1], Path(sys.argv[2])
    model, opts, optimizer, loader = setup()
    assert loader.combinedBatchSize == 2 * 2 * opts.replication_factor
    if phase == "resume":
        state = load_checkpoint(
            directory / "ckpt.pt", model=model, optimizer=optimizer, dataloader=loader
        )
        assert state["step"] == N, state["step"]
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    steps = {"full": N + M, "resume": M}[phase]
    stream = batches(loader)
    for step in range(steps):
        if phase == "full" and step == N:  # mid-run, as a training script checkpoints
            save_checkpoint(
                directory / "ckpt.pt",
                model=training,
                optimizer=optimizer,
                step=N,
                dataloader=loader,
            )
            torch.save(model.state_dict(), directory / f"first.{popdist.getInstanceIndex()}.pt")
        x, y = next(stream)
        training(x, y)
    torch.save(model.state_dict(), directory / f"{phase}.{popdist.getInstanceIndex()}.pt")
    print(f"OK {phase} {popdist.getInstanceIndex()} {loader.state_dict()}", flush=True)


if __name__ == "__main__":
    main()
