"""Train until poprun's time-limit notice, save, stop; resume later: ``ckpt_notice.py PHASE DIR``.

PHASE ``full`` trains STEPS steps without interruption. PHASE ``notice`` resumes from
``DIR/ckpt.pt`` when it exists (:func:`resume_checkpoint`). The first time through, after
step WAIT_AT each instance writes ``DIR/waiting.<instance>`` and waits for the notice to
reach it (the test sends it once every instance waits: no step can race it); then
:func:`save_on_notice` saves and the instance stops, exit code 0. A resumed run trains to
the end. Each instance writes its final weights to ``DIR/<phase>.<instance>.pt``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

import popdist
import popdist_torch as poptorch
from popdist_torch.checkpoint import resume_checkpoint, save_on_notice
from tests.bin.ckpt_resume import batches, setup

STEPS, WAIT_AT = 11, 4  # the notice falls mid-epoch (6 steps per epoch)
#: How long an instance waits for the notice before it gives up (a failed test, not a hang).
PATIENCE_S = 240.0


def wait_for_notice(marker: Path) -> None:
    """Say this instance waits, then wait for the notice's flag (set by popdist's handler)."""
    marker.touch()
    give_up = time.monotonic() + PATIENCE_S
    while not popdist.notice_received():
        if time.monotonic() > give_up:
            raise SystemExit(f"no time-limit notice reached {marker.name}")
        time.sleep(0.02)  # the flag is set by the signal handler; this only polls it


def main() -> None:
    phase, directory = sys.argv[1], Path(sys.argv[2])
    model, opts, optimizer, loader = setup()
    index = popdist.getInstanceIndex()
    ckpt = directory / "ckpt.pt"
    start = 0
    if phase == "notice":
        start = resume_checkpoint(ckpt, model=model, optimizer=optimizer, dataloader=loader)
        restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
        print(f"START {index} {start} restart={restarts}", flush=True)
    training = poptorch.trainingModel(model, opts, optimizer=optimizer)
    stream = batches(loader)
    for step in range(start, STEPS):
        x, y = next(stream)
        training(x, y)
        if phase != "notice":
            continue
        if start == 0 and step + 1 == WAIT_AT:
            wait_for_notice(directory / f"waiting.{index}")
        if save_on_notice(
            ckpt, model=training, optimizer=optimizer, step=step + 1, dataloader=loader
        ):
            print(f"SAVED {index} {step + 1}", flush=True)
            return
    torch.save(model.state_dict(), directory / f"{phase}.{index}.pt")
    print(f"OK {phase} {index}", flush=True)


if __name__ == "__main__":
    main()
