"""PopDist with Horovod: the pattern of the PopDist guide's PyTorch example, runnable.

    poprun --num-instances 2 --num-replicas 4 python examples/popdist_horovod.py --replicas 4
    python examples/popdist_horovod.py

Under poprun the launch decides the replicas (a differing ``--replicas`` is reported and
overridden), ``popdist.poptorch.Options`` carries this instance's share, and Horovod is
used for host-side values: the starting seed, the weights and a metric.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

import popdist
import popdist.poptorch
import popdist_torch as poptorch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="PopDist + Horovod example")
    parser.add_argument("--replicas", type=int, default=1, help="total replicas wanted")
    parser.add_argument("--steps", type=int, default=20)
    return parser.parse_args()


def setup_popdist(args: argparse.Namespace) -> None:
    """Bring up PopDist (and Horovod with it); take the replica counts from the launch."""
    popdist.init()
    args.use_popdist = True
    if popdist.getNumTotalReplicas() != args.replicas:
        print(
            f"--replicas {args.replicas} is overridden by poprun: "
            f"{popdist.getNumTotalReplicas()} replicas in total"
        )
    args.replicas = popdist.getNumLocalReplicas()
    args.instance = popdist.getInstanceIndex()
    args.instances = popdist.getNumInstances()


def make_options(args: argparse.Namespace) -> poptorch.Options:
    return popdist.poptorch.Options() if args.use_popdist else poptorch.Options()


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc(x).squeeze(-1)
        return out, F.mse_loss(out, y)


def main() -> None:
    args = parse_args()
    args.use_popdist = False
    args.instance, args.instances = 0, 1
    if popdist.isPopdistEnvSet():
        setup_popdist(args)
    opts = make_options(args)

    seed = 7
    if args.use_popdist and args.instances > 1:
        import horovod.torch as hvd

        seed = int(hvd.broadcast(torch.tensor([seed]), root_rank=0, name="seed").item())
    model = Regressor()
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))

    # Each instance draws its own samples; replicas split each call's batch.
    gen = torch.Generator().manual_seed(seed + args.instance)
    true_w = torch.tensor([1.0, -2.0, 0.5, 3.0])
    batch = 8 * opts.replication_factor
    loss = torch.tensor(0.0)
    for _ in range(args.steps):
        x = torch.randn(batch, 4, generator=gen)
        _, loss = training(x, x @ true_w)
    mean_loss = float(loss.mean())
    if args.use_popdist and args.instances > 1:
        import horovod.torch as hvd

        mean_loss = float(hvd.allreduce(torch.tensor(mean_loss), op=hvd.Average, name="loss"))
    if args.instance == 0:
        print(
            f"{args.instances} instance(s) x {opts.replication_factor} local replica(s): "
            f"final loss {mean_loss:.4f}, weights {model.fc.weight.detach().numpy().round(2)}"
        )


if __name__ == "__main__":
    main()
