"""What the Lightning IPU listings leave to the reader: ``MyLightningModule`` and its steps.

The seed listings (Lightning's "Accelerator: IPU training" page) write ``model =
MyLightningModule()`` without defining it, or define its layers and leave the rest as
``...``. This module supplies those parts and nothing else: a small classifier on
generated data (no download), its ``training_step``, optimizer and DataLoader, and an
``on_fit_end`` report the test reads (steps run, replicas, whether the weights moved);
training stops after one epoch (the listings leave ``max_epochs`` at Lightning's 1000).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

SAMPLES = 640


def _data(features: int, classes: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, features, generator=g)
    y = torch.randint(0, classes, (SAMPLES,), generator=g)
    return TensorDataset(x, y)


def train_dataloader(self: pl.LightningModule) -> DataLoader[Any]:
    """Micro-batches of one sample (the listings' device iterations make them combined)."""
    return DataLoader(_data(5, 5), batch_size=1)


def forward_through_layers(self: Any, x: torch.Tensor) -> torch.Tensor:
    """The listing's layers in order (the BeginBlock listing leaves ``forward`` to "...")."""
    return self.softmax(self.layer4(self.layer3(self.layer2(self.layer1(x)))))


def training_step(self: pl.LightningModule, batch: Any, batch_idx: Any) -> torch.Tensor:
    """Negative log-likelihood of the softmax the listings' models end with."""
    x, y = batch
    loss = F.nll_loss(torch.log(self(x) + 1e-6), y)
    self.log("train_loss", loss)
    return loss


def configure_optimizers(self: pl.LightningModule) -> torch.optim.Optimizer:
    """Plain SGD."""
    return torch.optim.SGD(self.parameters(), lr=0.1)


def on_fit_start(self: pl.LightningModule) -> None:
    """Remember the initial weights."""
    self._initial = [p.detach().clone() for p in self.parameters()]  # type: ignore[assignment]


def on_train_epoch_end(self: pl.LightningModule) -> None:
    """One epoch is enough for a test (the listings leave Lightning's 1000 epochs)."""
    self.trainer.should_stop = True


def on_fit_end(self: pl.LightningModule) -> None:
    """Report what ran: the test checks this line."""
    moved = any(
        not torch.equal(p, q)
        for p, q in zip(self.parameters(), self._initial, strict=True)  # type: ignore[arg-type]
    )
    trainer = self.trainer
    print(
        f"seed listing: global_step={trainer.global_step} replicas={trainer.num_devices} "
        f"strategy={type(trainer.strategy).__name__} weights_moved={moved} "
        f"train_loss={float(trainer.callback_metrics['train_loss']):.4f}",
        flush=True,
    )


class MyLightningModule(pl.LightningModule):
    """The module the first two listings train: Linear → ReLU → Linear → softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.layer1 = torch.nn.Linear(5, 10)
        self.layer2 = torch.nn.Linear(10, 5)
        self.act = torch.nn.ReLU()
        self.softmax = torch.nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax(self.layer2(self.act(self.layer1(x))))

    training_step = training_step
    configure_optimizers = configure_optimizers
    train_dataloader = train_dataloader
    on_fit_start = on_fit_start
    on_train_epoch_end = on_train_epoch_end
    on_fit_end = on_fit_end
