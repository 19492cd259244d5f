"""Train under ``poprun --max-restarts``, killed once mid-training: ``ckpt_restart.py PHASE DIR``.

PHASE ``full`` trains STEPS steps without interruption. PHASE ``restart`` resumes from
``DIR/ckpt.pt`` when it exists (:func:`resume_checkpoint`), saves a checkpoint after every
step, and the first time through instance 1 SIGKILLs itself right after the save of step
KILL_AT: poprun relaunches the job, which resumes there. Each instance writes its final
weights to ``DIR/<phase>.<instance>.pt`` (they must match exactly).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

import popdist
import popdist_torch as poptorch
from popdist_torch.checkpoint import resume_checkpoint, save_checkpoint
from tests.bin.ckpt_resume import batches, setup

STEPS, KILL_AT = 11, 5  # the kill falls mid-epoch (6 steps per epoch)


def main() -> None:
    phase, directory = sys.argv[1], Path(sys.argv[2])
    model, opts, optimizer, loader = setup()
    ckpt = directory / "ckpt.pt"
    start = 0
    if phase == "restart":
        start = resume_checkpoint(ckpt, model=model, optimizer=optimizer, dataloader=loader)
        print(f"START {popdist.getInstanceIndex()} {start}", flush=True)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    stream = batches(loader)
    for step in range(start, STEPS):
        x, y = next(stream)
        training(x, y)
        if phase == "restart":
            save_checkpoint(ckpt, model=training, optimizer=optimizer, step=step + 1,
                            dataloader=loader)  # fmt: skip
            marker = directory / "killed"
            if step + 1 == KILL_AT and popdist.getInstanceIndex() == 1 and not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
    torch.save(model.state_dict(), directory / f"{phase}.{popdist.getInstanceIndex()}.pt")
    print(f"OK {phase} {popdist.getInstanceIndex()}", flush=True)


if __name__ == "__main__":
    main()
