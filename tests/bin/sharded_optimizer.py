"""Child of tests/parallel/test_sharded_optimizer.py (2 instances under poprun).

Trains the same model twice on each instance's own data, with the optimizer state whole and
with ``useReplicatedTensorSharding(True)``, for a PopTorch AdamW (clipped, loss-scaled) and
torch's SGD with momentum. Checks, and exits non-zero with a message if not: the weights are
equal bit for bit; each instance keeps the state of its own shard only, the shards are
disjoint and cover every parameter; ``save_checkpoint`` of the sharded optimizer writes the
whole state, equal to the unsharded one. Prints ``OK <instance>``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import popdist
import popdist.collectives
import popdist.poptorch
import popdist_torch as poptorch
from popdist_torch.checkpoint import read_checkpoint


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4), nn.Tanh())
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)).pow(2).mean()


Factory = Callable[[nn.Module], torch.optim.Optimizer]
OPTIMIZERS: dict[str, Factory] = {
    "poptorch AdamW": lambda m: poptorch.optim.AdamW(
        m.parameters(), lr=0.05, max_grad_norm=0.5, loss_scaling=8.0
    ),
    "torch SGD": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
}


def fail(message: str) -> None:
    print(f"FAIL instance {popdist.getInstanceIndex()}: {message}", flush=True)
    sys.exit(1)


def train(optimizer_of: Factory, sharded: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    opts = popdist.poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    if sharded:
        location = poptorch.TensorLocationSettings().useReplicatedTensorSharding(True)
        opts.TensorLocations.setOptimizerLocation(location)
    model = Net()
    optimizer = optimizer_of(model)
    executor = poptorch.trainingModel(model, opts, optimizer)
    gen = torch.Generator().manual_seed(10 + popdist.getInstanceIndex())  # each its own data
    for _ in range(3):
        executor(torch.randn(2 * 2 * 4, 6, generator=gen))
    executor.destroy()
    return model, optimizer


def check(name: str, directory: Path) -> None:
    optimizer_of = OPTIMIZERS[name]
    whole_model, whole = train(optimizer_of, sharded=False)
    model, sharded = train(optimizer_of, sharded=True)
    params = list(model.parameters())
    for got, want in zip(params, whole_model.parameters(), strict=True):
        if not torch.equal(got, want):
            fail(f"{name}: sharded weights differ from the unsharded ones")
    held = torch.tensor([1.0 if p in sharded.state else 0.0 for p in params])
    counts = popdist.collectives.for_run().allgather(held.unsqueeze(0)).sum(0)
    if not torch.equal(counts, torch.ones(len(params))):
        fail(f"{name}: each parameter's state should be on exactly one instance: {counts}")
    path = directory / f"{name.replace(' ', '-')}.pt"
    poptorch.save_checkpoint(path, model=model, optimizer=sharded)
    saved = read_checkpoint(path)["optimizer"]["state"]
    expected = whole.state_dict()["state"]
    if sorted(saved) != sorted(expected):
        fail(f"{name}: the checkpoint holds the state of {sorted(saved)}, not {sorted(expected)}")
    for index, state in expected.items():
        for key, value in state.items():
            if not torch.equal(torch.as_tensor(saved[index][key]), torch.as_tensor(value)):
                fail(f"{name}: checkpointed state {index}.{key} differs from the unsharded one")


def main() -> None:
    directory = Path(sys.argv[1])
    for name in OPTIMIZERS:
        check(name, directory)
    print(f"OK {popdist.getInstanceIndex()}", flush=True)


if __name__ == "__main__":
    main()
