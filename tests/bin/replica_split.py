"""Child of tests/parallel/test_replica_split.py: 6 replicas on a split given on the command line.

Usage: replica_split.py OUT_DIR COUNTS, e.g. ``2,2,1,1`` (local replicas per instance, run
under ``mpirun -np len(COUNTS)``). The instance makes itself poprun's instance (the
``POPDIST_*`` variables ``popdist.env.instance_environment`` gives, non-uniform when the
counts differ), then trains one model per (reduction, optimizer) on a shuffled,
topology-invariant DataLoader and writes ``OUT_DIR/<rank>.pt``: the final weights and the
sample indices it consumed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from popdist import env

DI, GA, MICRO, SAMPLES, EPOCHS = 2, 2, 2, 150, 2
OPTIMIZERS = {
    "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=0.02, weight_decay=0.1),
}


class Samples(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Fixed random inputs and labels, and each sample's index."""

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(5)
        self.x = torch.randn(SAMPLES, 5, generator=gen)
        self.y = torch.randint(0, 4, (SAMPLES,), generator=gen)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i], torch.tensor(i)


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out, F.cross_entropy(out, y)


def become_instance(counts: list[int]) -> int:
    rank, total = int(os.environ["OMPI_COMM_WORLD_RANK"]), sum(counts)
    os.environ.update(
        env.instance_environment(
            num_total_replicas=total,
            num_ipus_per_replica=1,
            num_instances=len(counts),
            instance_index=rank,
            local_instance_index=rank,
            num_local_instances=len(counts),
            host="localhost",
            num_local_replicas=counts[rank],
            replica_index_offset=sum(counts[:rank]),
        )
    )
    return rank


def main() -> None:
    out_dir, counts = Path(sys.argv[1]), [int(c) for c in sys.argv[2].split(",")]
    rank = become_instance(counts)
    import popdist.poptorch
    import popdist_torch as poptorch

    result: dict[str, object] = {}
    for mode in ("deterministic", "default"):
        for opt_name, make_opt in OPTIMIZERS.items():
            opts = popdist.poptorch.Options().deviceIterations(DI).randomSeed(11)
            opts.Training.gradientAccumulation(GA)
            opts.Training.deterministicReduction(mode == "deterministic")
            torch.manual_seed(100 + rank)  # instance 0's weights must win the broadcast
            model = Mlp()
            loader = poptorch.DataLoader(
                opts, Samples(), batch_size=MICRO, shuffle=True, order="topology_invariant"
            )
            wrapped = poptorch.trainingModel(model, opts, make_opt(model))
            consumed: list[int] = []
            for _ in range(EPOCHS):
                for x, y, index in loader:
                    wrapped(x, y, index)
                    consumed.extend(index.tolist())
            result[f"{mode}.{opt_name}"] = {k: v.clone() for k, v in model.state_dict().items()}
            result[f"{mode}.{opt_name}.consumed"] = consumed
            wrapped.destroy()
    torch.save(result, out_dir / f"{rank}.pt")


if __name__ == "__main__":
    main()
