"""One LightningModule on scikit-learn's digits: the CPU, or popdist_torch's replicas under poprun.

    python examples/lightning_digits.py --accelerator cpu
    python examples/lightning_digits.py --accelerator ipu --devices 4
    poprun --num-instances 2 --num-replicas 4 python examples/lightning_digits.py --accelerator ipu

The module is written once, as for any Lightning accelerator; the one line that changes is
the Trainer's ``accelerator`` (and ``devices``: local replicas per instance, ``"auto"`` takes
poprun's). Under poprun every instance runs this script; Lightning spawns nothing. The
DataLoader's ``batch_size`` is the micro-batch (one replica's), so with ``--accelerator
ipu`` the global batch is ``batch_size × replicas × device iterations`` per call. The
script prints the test accuracy (reduced over instances) once, from instance 0.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from popdist_lightning import IPUStrategy


class DigitsClassifier(pl.LightningModule):
    """An MLP on 8×8 digits; nothing in it knows where it runs."""

    def __init__(self, batch_size: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        x, y = load_digits(return_X_y=True)
        x_train, x_test, y_train, y_test = train_test_split(
            x / 16.0, y, test_size=0.25, random_state=0
        )
        self.train_set = _dataset(x_train, y_train)
        self.test_set = _dataset(x_test, y_test)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        accuracy = (self(x).argmax(-1) == y).float().mean()
        self.log("test_acc", accuracy, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def test_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)


def _dataset(x: Any, y: Any) -> TensorDataset:
    return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--accelerator", choices=["cpu", "ipu"], default="ipu")
    parser.add_argument("--devices", default="auto", help="local replicas (ipu) or processes")
    parser.add_argument("--device-iterations", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)  # same initial weights and shuffling everywhere
    model = DigitsClassifier()
    extra: dict[str, Any] = {}
    if args.accelerator == "ipu":
        extra["strategy"] = IPUStrategy(device_iterations=args.device_iterations)
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    trainer = pl.Trainer(
        accelerator=args.accelerator,  # the one line that changes
        devices=devices if args.accelerator == "ipu" else 1,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        **extra,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(model)
        (result,) = trainer.test(model, verbose=False)
    if trainer.is_global_zero:
        print(
            f"{args.accelerator}: {trainer.world_size} instance(s) x {trainer.num_devices} "
            f"device(s), test accuracy {result['test_acc']:.3f}"
        )


if __name__ == "__main__":
    main()
