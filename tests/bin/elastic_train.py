"""Train with a checkpoint after every step, resuming after poprun relaunches the job:
``elastic_train.py DIR [STEPS [PAUSE_S]]``.

Each step's samples are known by their dataset index (the dataset's third tensor): every
instance appends ``STEP GENERATION INDEX,INDEX,...`` for each step it trained to
``DIR/log/<instance>.g<generation>`` (``POPDIST_GENERATION``, 0 without it), so a test can
take, for every step, the newest generation's samples and compare their multiset with an
uninterrupted run's. ``PAUSE_S`` (default 0.3) after each step paces the run so a fault can
land in its middle. At poprun's save-now notice (``popdist.should_stop()``, after the
step's checkpoint) it stops there and prints ``STOPPED``. At the end each instance writes its weights to
``DIR/final.<instance>.pt`` and prints ``OK <instance> <generation> <instances>``.

Checkpoints: ``DIR/ckpt.pt``, written by instance 0 (the launch host's, so a lost other host
never takes it). A job resumed on another topology (fewer instances, more replicas each) must
find the same data order: the DataLoader's position is topology-invariant.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

import popdist
import popdist.poptorch
import popdist_torch as poptorch
from popdist_torch.checkpoint import resume_checkpoint, save_checkpoint

BATCH = 2  # per replica; 6 replicas, one device iteration: 12 samples a step


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.body(x)
        return out, nn.functional.mse_loss(out, y)


def main() -> None:
    directory = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
    generation = int(os.environ.get("POPDIST_GENERATION", "0") or 0)
    popdist.init()
    torch.manual_seed(0)
    model = Net()
    opts = popdist.poptorch.Options()
    opts.randomSeed(42)
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(96, 4, generator=gen)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin(), torch.arange(96))
    loader = poptorch.DataLoader(
        opts, data, batch_size=BATCH, shuffle=True, order="topology_invariant"
    )
    ckpt = directory / "ckpt.pt"
    start = resume_checkpoint(ckpt, model=model, optimizer=optimizer, dataloader=loader)
    instance = popdist.getInstanceIndex()
    print(f"START {instance} g{generation} step {start}", flush=True)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    log_dir = directory / "log"
    log_dir.mkdir(exist_ok=True)
    log = open(log_dir / f"{instance}.g{generation}", "a")  # noqa: SIM115
    stream = iter(())
    step = start
    while step < steps:
        try:
            x, y, index = next(stream)  # type: ignore[call-overload]
        except StopIteration:
            stream = iter(loader)  # every pass is a new epoch
            continue
        training(x, y, index)
        step += 1
        log.write(f"{step} {generation} {','.join(map(str, index.tolist()))}\n")
        log.flush()
        save_checkpoint(ckpt, model=training, optimizer=optimizer, step=step, dataloader=loader)
        if popdist.should_stop():  # poprun's save-now notice (here: to readmit a host)
            print(f"STOPPED {instance} g{generation} step {step}", flush=True)
            return
        time.sleep(pause)
    torch.save(model.state_dict(), directory / f"final.{instance}.pt")
    print(f"OK {instance} {generation} {popdist.getNumInstances()}", flush=True)


if __name__ == "__main__":
    main()
