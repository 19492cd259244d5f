"""Run under poprun: fit, test and predict the test Classifier with IPUStrategy.

Writes, per instance, ``OUT/result.<rank>.pt`` (state dict, metrics, prediction count...)
and ``OUT/saves.<rank>`` (one line per checkpoint this instance wrote); checkpoints go to
``OUT/ckpt`` through Lightning's ModelCheckpoint. ``--fail-on N``: instance N raises in
its first training step. ``--resume CKPT``: continue from a checkpoint. ``--autoreport``:
``IPUStrategy(autoreport=True)`` into ``OUT/report``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only

import popdist
from popdist_lightning import IPUStrategy
from tests.lightning.cases import QUIET, Classifier

MICRO = 2


class RecordingIO(TorchCheckpointIO):
    """Torch's checkpoint I/O that notes which instance wrote which file."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        with self.log.open("a") as f:
            f.write(f"{Path(path).name}\n")
        super().save_checkpoint(checkpoint, path, storage_options)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("device_iterations", type=int)
    parser.add_argument("accumulation", type=int)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fail-on", type=int, default=-1)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--autoreport", action="store_true")
    args = parser.parse_args()
    out: Path = args.out
    rank = popdist.getInstanceIndex()
    model = Classifier(MICRO, sync_dist=True)
    if rank == args.fail_on:

        def broken(batch: object, batch_idx: int) -> torch.Tensor:
            raise RuntimeError(f"instance {rank} fails on purpose")

        model.training_step = broken  # type: ignore[method-assign]
    trainer = pl.Trainer(
        accelerator="ipu",
        devices="auto",
        strategy=IPUStrategy(
            device_iterations=args.device_iterations,
            checkpoint_io=RecordingIO(out / f"saves.{rank}"),
            autoreport=args.autoreport,
            autoreport_dir=out / "report" if args.autoreport else None,
        ),
        accumulate_grad_batches=args.accumulation,
        max_epochs=args.epochs,
        callbacks=[ModelCheckpoint(dirpath=out / "ckpt", save_top_k=-1)],
        **QUIET,
    )
    trainer.fit(model, ckpt_path=args.resume)

    @rank_zero_only
    def once() -> None:
        (out / f"rank_zero_only.{rank}").write_text("ran\n")

    once()
    fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    tested = trainer.test(model, verbose=False)[0]
    predictions = trainer.predict(model)
    assert predictions is not None
    torch.save(
        {
            "state": model.state_dict(),
            "fit_metrics": fit_metrics,
            "test": tested,
            "predicted": sum(p.shape[0] for p in predictions),  # type: ignore[union-attr]
            "global_step": trainer.global_step,
            "is_global_zero": trainer.is_global_zero,
            "world_size": trainer.world_size,
            "num_devices": trainer.num_devices,
        },
        out / f"result.{rank}.pt",
    )


if __name__ == "__main__":
    main()
