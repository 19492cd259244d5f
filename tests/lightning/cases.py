"""The LightningModule the Lightning tests train, and a CPU reference run of it.

A small classifier on generated data (no downloads); the DataLoader's ``batch_size`` is
the micro-batch, so the ``accelerator="cpu"`` reference uses ``micro × replicas`` per
batch (with the same ``accumulate_grad_batches``) to see the same samples per update.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

SAMPLES = 192
FEATURES = 8
CLASSES = 3


def dataset(seed: int = 1) -> TensorDataset:
    """Generated samples: the same on every instance."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return TensorDataset(x, y)


class Classifier(pl.LightningModule):
    """An MLP that logs its loss, with every step defined; ``batch_size`` is the micro-batch."""

    def __init__(self, batch_size: int, lr: float = 0.1, sync_dist: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, CLASSES)
        )
        self.batch_size = batch_size
        self.lr = lr
        self.sync_dist = sync_dist

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, sync_dist=self.sync_dist)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=self.sync_dist)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        accuracy = (self(x).argmax(-1) == y).float().mean()
        self.log("test_acc", accuracy, sync_dist=self.sync_dist)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def _loader(self) -> DataLoader[Any]:
        return DataLoader(dataset(), batch_size=self.batch_size)

    def train_dataloader(self) -> DataLoader[Any]:
        return self._loader()

    def val_dataloader(self) -> DataLoader[Any]:
        return self._loader()

    def test_dataloader(self) -> DataLoader[Any]:
        return self._loader()

    def predict_dataloader(self) -> DataLoader[Any]:
        return self._loader()


QUIET: dict[str, Any] = {
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


def cpu_reference(
    replicas: int, micro: int, accumulation: int, epochs: int, **trainer: Any
) -> Classifier:
    """``Trainer(accelerator="cpu")`` on the same global batches."""
    model = Classifier(micro * replicas)
    pl.Trainer(
        accelerator="cpu",
        devices=1,
        plugins=[plain_environment()],
        max_epochs=epochs,
        accumulate_grad_batches=accumulation,
        enable_checkpointing=False,
        **QUIET,
        **trainer,
    ).fit(model)
    return model


def plain_environment() -> LightningEnvironment:
    """One process, rank 0: skips Lightning's MPI detection, which initialises MPI
    through mpi4py (and leaves a singleton ``orted`` running) outside a launcher."""
    return LightningEnvironment()


def max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    """Largest absolute difference between two modules' parameters."""
    return max(
        (p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )
