"""Child of tests/parallel/test_wild_anchors_poprun.py: anchored gradients under poprun.

Each instance trains a copy of the same model on its shard of a global batch (local
replicas and gradient accumulation from the options) and checks, exiting non-zero with a
message if not, that the anchored gradient is the parameter's ``.grad`` after the step and
the gradient of the mean loss over the whole global batch (what the optimizer applied:
reduced over replicas, accumulation steps and instances). Prints one JSON line per instance
with the anchored gradient, so the test can compare the instances.
"""

from __future__ import annotations

import copy
import json
import sys

import torch
from torch import nn

import popdist.poptorch
import popdist_torch as poptorch

MICRO = 2
ACCUMULATION = 2


class Regression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out, nn.functional.mse_loss(out, y)


def fail(rank: int, message: str) -> None:
    print(f"FAIL instance {rank}: {message}", flush=True)
    sys.exit(1)


def main() -> None:
    opts = popdist.poptorch.Options()
    opts.Training.gradientAccumulation(ACCUMULATION)
    opts.anchorTensor("grad_bias", "Gradient___fc2.bias")
    opts.anchorTensor("grad_weight", "Gradient___fc1.weight")
    rank, instances = opts.Distributed.processId, opts.Distributed.numProcesses
    per_instance = ACCUMULATION * opts.replication_factor * MICRO
    torch.manual_seed(rank)  # different starts: instance 0's weights are broadcast
    model = Regression()
    trained = poptorch.trainingModel(
        model, opts, poptorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    )
    gen = torch.Generator().manual_seed(0)
    grads = []
    for _ in range(2):
        x = torch.randn(instances * per_instance, 6, generator=gen)
        y = torch.randn(instances * per_instance, 3, generator=gen)
        reference = copy.deepcopy(model)
        shard = slice(rank * per_instance, (rank + 1) * per_instance)
        trained(x[shard], y[shard])
        anchored = trained.getAnchoredTensor("grad_bias")
        if model.fc2.bias.grad is None or not torch.equal(anchored, model.fc2.bias.grad):
            fail(rank, "the anchored gradient is not the parameter's .grad after the step")
        weight_grad = model.fc1.weight.grad
        if weight_grad is None or not torch.equal(
            trained.getAnchoredTensor("grad_weight"), weight_grad
        ):
            fail(rank, "the anchored fc1.weight gradient is not its .grad")
        nn.functional.mse_loss(reference(x, y)[0], y).backward()  # type: ignore[no-untyped-call]
        expected = reference.fc2.bias.grad
        if expected is None or not torch.allclose(anchored, expected, rtol=1e-4, atol=1e-6):
            fail(rank, f"anchored {anchored.tolist()} != global {expected}")
        grads.append(anchored.tolist())
    print(json.dumps({"instance": rank, "instances": instances, "grads": grads}), flush=True)


if __name__ == "__main__":
    main()
