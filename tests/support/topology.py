"""The shared case of the topology-invariance test: models, optimizers, global batches."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

DI, GA, MICRO, CALLS, GLOBAL_REPLICAS = 3, 2, 3, 2, 4


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out, F.cross_entropy(out, y)


class PythonControlFlow(Mlp):
    """``vmap`` cannot run ``.item()``: its replicas run one after the other."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if float(x.abs().sum().item()) > 1e9:
            x = torch.zeros_like(x)
        return super().forward(x, y)


MODELS: dict[str, type[Mlp]] = {"fused": Mlp, "serial": PythonControlFlow}
OPTIMIZERS: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.9),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=0.02, weight_decay=0.1),
}


def make_model(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]()


def global_data(call: int, replicas: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One call's global batches, laid out ``[DI, GA, replicas, MICRO, ...]``."""
    gen = torch.Generator().manual_seed(call)
    x = torch.randn(DI, GA, replicas, MICRO, 5, generator=gen)
    y = torch.randint(0, 4, (DI, GA, replicas, MICRO), generator=gen)
    return x, y


def reference(name: str, opt_name: str) -> dict[str, torch.Tensor]:
    """A plain torch loop over the global batch of each update, mean loss."""
    model = make_model(name, seed=100)
    opt = OPTIMIZERS[opt_name](model)
    for call in range(CALLS):
        x, y = global_data(call, GLOBAL_REPLICAS)
        for d in range(DI):
            opt.zero_grad()
            _, loss = model(x[d].reshape(-1, 5), y[d].reshape(-1))
            loss.backward()
            opt.step()
    return model.state_dict()
