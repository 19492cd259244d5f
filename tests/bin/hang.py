"""A job that hangs, or not, in the ways poprun's progress verdicts tell apart (issue 27).

``hang.py MODE [SECONDS]``, launched by poprun with two or more instances; instance 1 is the
odd one out:
- ``sleep``: instance 1 blocks in a function of its own (:func:`stall_here`) before the
  allreduce the others wait in;
- ``lock``: every instance trains a step; instance 1 dead-locks on a lock
  (:func:`take_lock_twice`) inside its forward pass, the others wait in the gradient
  allreduce;
- ``desync``: instance 1's model has a wider layer: the gradient shapes differ;
- ``evaluate``: instance 1 evaluates alone for SECONDS (:func:`evaluate_alone`), the others
  wait for it in a barrier; then every instance finishes (exit 0).
- ``train``: a few steps on every instance, then exit 0 (``SECONDS`` between steps).
"""

from __future__ import annotations

import sys
import threading
import time

import torch

import popdist
import popdist.collectives
import popdist_torch


def stall_here(seconds: float) -> None:
    time.sleep(seconds)


def take_lock_twice() -> None:
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # never returns


def evaluate_alone(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.05)


class Model(torch.nn.Module):
    def __init__(self, width: int, lock: bool) -> None:
        super().__init__()
        self.lock = lock
        self.fc = torch.nn.Linear(4, width)
        self.out = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.lock:
            take_lock_twice()
        out = self.out(torch.relu(self.fc(x)))
        loss = torch.nn.functional.mse_loss(out, y)
        return out, loss


def train(width: int, steps: int, lock: bool = False, pause: float = 0.0) -> None:
    model = Model(width, lock)
    opts = popdist.poptorch.Options()
    trainer = popdist_torch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    x, y = torch.ones(4, 4), torch.zeros(4, 1)
    for step in range(steps):
        trainer(x, y)
        print(f"instance {popdist.getInstanceIndex()} step {step}", flush=True)
        time.sleep(pause)


def main() -> None:
    mode = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 1000.0
    popdist.init()
    me = popdist.getInstanceIndex()
    collectives = popdist.collectives.for_run()
    odd = me == 1
    if mode == "sleep":
        collectives.barrier()
        if odd:
            stall_here(seconds)
        collectives.allreduce_(torch.ones(3), name="after.stall")
    elif mode == "lock":
        train(8, 3, lock=odd)
    elif mode == "desync":
        train(16 if odd else 8, 3)
    elif mode == "evaluate":
        train(8, 2)
        if odd:
            evaluate_alone(seconds)
        collectives.barrier()
        train(8, 2)
    elif mode == "train":
        train(8, 12, pause=seconds if len(sys.argv) > 2 else 0.0)
    print(f"instance {me} done", flush=True)


if __name__ == "__main__":
    main()
