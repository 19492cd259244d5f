"""Child of tests/launch/test_poprun_status.py: a small training run that reports progress.

``--steps N`` executor calls of a tiny model (each ends in the gradients' allreduce, so
the instances step together). ``--slow-instance I --slow-s S``: instance I spends S more
seconds of its own work before each step (the straggler). ``--hold-file PATH --hold-after
K``: after K steps instance 0 waits until the test creates PATH (the test reads the status
endpoint and asks for the summary meanwhile); the other instances wait for it in the next
step's allreduce, which the status shows as their pending collective.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import popdist
import popdist.poptorch
import popdist_torch as poptorch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--slow-instance", type=int, default=-1)
    parser.add_argument("--slow-s", type=float, default=0.0)
    parser.add_argument("--hold-file", default="")
    parser.add_argument("--hold-after", type=int, default=3)
    args = parser.parse_args()

    if popdist.getNumInstances() > 1:
        popdist.init()
    index = popdist.getInstanceIndex()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.model(x)
            return out, torch.nn.functional.mse_loss(out, y)

    opts = popdist.poptorch.Options()
    wrapped = poptorch.trainingModel(Loss(), opts, torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(4 * opts.replication_factor, 8), torch.randn(4 * opts.replication_factor, 2)
    for step in range(args.steps):
        if index == args.slow_instance:
            time.sleep(args.slow_s)  # this instance's own work takes longer
        wrapped(x, y)
        if args.hold_file and index == 0 and step + 1 == args.hold_after:
            print(f"holding after step {step + 1}", flush=True)
            while not os.path.exists(args.hold_file):  # the test creates it when done
                time.sleep(0.05)
    print(f"instance {index} done", flush=True)


if __name__ == "__main__":
    main()
