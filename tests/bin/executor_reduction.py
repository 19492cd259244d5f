"""Child of tests/parallel/test_executor_horovod.py (2 processes under mpirun).

Checks, and exits non-zero with a message if not: one allreduce per parameter per weight
update (none on intermediate accumulation steps); Sum reduction sums over instances;
broadcastBuffers(False) leaves buffers alone while parameters are broadcast; the backend is
the one ``POPDIST_BACKEND`` names and the torch backend never imports Horovod; prints OK.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

import popdist
import popdist_torch as poptorch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("marker", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return poptorch.identity_loss(self.fc(x).sum(), reduction="none")


def fail(message: str) -> None:
    print(f"FAIL rank {popdist.getInstanceIndex()}: {message}", flush=True)
    sys.exit(1)


def main() -> None:
    opts = poptorch.Options().deviceIterations(2).replicationFactor(2).broadcastBuffers(False)
    opts.Training.gradientAccumulation(3)
    opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    rank = opts.Distributed.processId
    torch.manual_seed(rank)
    model = Net()
    model.marker.fill_(rank)
    backend = popdist.collectives.for_run()
    # Counted from before the wrap: the reducer takes the backend's methods when it is built.
    launches: list[str] = []
    real = backend.allreduce_async_

    def counting(tensor: torch.Tensor, **kwargs: object) -> object:
        launches.append(str(kwargs.get("name")))
        return real(tensor, **kwargs)  # type: ignore[arg-type]

    backend.allreduce_async_ = counting  # type: ignore[method-assign]
    wrapped = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=1.0))
    launches.clear()  # the gradients' launches only
    if model.marker.item() != rank:
        fail("broadcastBuffers(False) but the buffer was broadcast")
    start = model.fc.weight.detach().clone()
    if backend.name != os.environ.get("POPDIST_BACKEND", "horovod"):
        fail(f"backend {backend.name} but POPDIST_BACKEND={os.environ.get('POPDIST_BACKEND')}")
    if backend.name == "torch" and "horovod" in sys.modules:
        fail("the torch backend imported Horovod")
    # every sample is x = rank + 1: d(sum fc(x))/dW = 2 rows of x summed over samples
    micro = 2
    x = torch.full((2 * 3 * 2 * micro, 3), float(rank + 1))
    wrapped(x)
    params = len(list(model.parameters()))
    if len(launches) != 2 * params:
        fail(f"{len(launches)} allreduce launches for 2 updates of {params} parameters")
    # Sum over 2 instances x 3 steps x 2 replicas x micro samples: grad per weight entry
    per_update = sum(3 * 2 * micro * (r + 1) for r in range(backend.size()))
    expected = start - 2 * per_update
    if not torch.allclose(model.fc.weight, expected):
        fail(f"weights {model.fc.weight.tolist()} != expected {expected.tolist()}")
    print("OK", flush=True)


if __name__ == "__main__":
    main()
