"""Train on scikit-learn's digits in a Slurm job that may reach its time limit, and resume.

    sbatch examples/slurm_train.sbatch        # see the script: poprun, the notice, requeue

Starts from its checkpoint when there is one (a requeued job runs its script again),
saves every ``--save-every`` steps, and asks ``save_on_notice`` after every step: when
poprun's time-limit notice has reached the job, every instance saves at the same step and
the script stops; poprun then exits 75 and, with ``--requeue-on-timeout``, puts the job back
in the queue. The resumed run ends with the weights an uninterrupted run would have.
Outside Slurm, ``poprun --timeout 60 --time-limit-margin 30 python
examples/slurm_train.py`` shows the same path.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

import torch
from train_digits import Classifier, datasets

import popdist
import popdist.poptorch
import popdist_torch as poptorch
from popdist_torch.checkpoint import resume_checkpoint, save_checkpoint, save_on_notice


def batches(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader  # each pass is one epoch; the loader's state says where it is


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--save-every", type=int, default=200)
    parser.add_argument("--checkpoint", default="slurm-digits.pt")
    args = parser.parse_args()

    popdist.init()
    opts = popdist.poptorch.Options()
    opts.randomSeed(0)
    torch.manual_seed(1234)
    model = Classifier()
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=0.005)
    train, _ = datasets()
    loader = poptorch.DataLoader(opts, train, batch_size=8, shuffle=True)
    start = resume_checkpoint(args.checkpoint, model=model, optimizer=optimizer, dataloader=loader)
    leader = popdist.getInstanceIndex() == 0
    if leader:
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        print(f"starting at step {start} (Slurm restart count {restarts})", flush=True)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    stream = batches(loader)
    for step in range(start, args.steps):
        x, y = next(stream)
        _, losses = training(x, y)
        saved = save_on_notice(
            args.checkpoint, model=training, optimizer=optimizer, step=step + 1, dataloader=loader
        )
        if saved:
            if leader:
                print(f"time limit near: saved step {step + 1}, stopping", flush=True)
            return 0
        if (step + 1) % args.save_every == 0:
            save_checkpoint(
                args.checkpoint,
                model=training,
                optimizer=optimizer,
                step=step + 1,
                dataloader=loader,
            )
    if leader:
        print(f"done: {args.steps} steps, last loss {float(losses.mean()):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
