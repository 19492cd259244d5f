"""Run under poprun: fit, validate, test and predict the test Classifier with IPUStrategy.

argv: OUT_DIR DEVICE_ITERATIONS ACCUMULATION [fail-on-instance-N]. Writes, per instance,
``weights.<rank>.pt`` (state dict, test metrics, prediction count) and checkpoints
(instance 0 only, through Lightning's ModelCheckpoint) under OUT_DIR/ckpt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import popdist
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from popdist_lightning import IPUStrategy
from tests.lightning.cases import QUIET, Classifier

MICRO = 2


def main() -> None:
    out = Path(sys.argv[1])
    device_iterations, accumulation = int(sys.argv[2]), int(sys.argv[3])
    fail_on = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    rank = popdist.getInstanceIndex()
    model = Classifier(MICRO, sync_dist=True)
    if rank == fail_on:

        def broken(batch: object, batch_idx: int) -> torch.Tensor:
            raise RuntimeError(f"instance {rank} fails on purpose")

        model.training_step = broken  # type: ignore[method-assign]
    trainer = pl.Trainer(
        accelerator="ipu",
        devices="auto",
        strategy=IPUStrategy(device_iterations=device_iterations),
        accumulate_grad_batches=accumulation,
        max_epochs=2,
        callbacks=[ModelCheckpoint(dirpath=out / "ckpt", save_top_k=-1)],
        **QUIET,
    )
    trainer.fit(model)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    tested = trainer.test(model, verbose=False)[0]
    predictions = trainer.predict(model)
    assert predictions is not None
    torch.save(
        {
            "state": model.state_dict(),
            "fit_metrics": metrics,
            "test": tested,
            "predicted": sum(p.shape[0] for p in predictions),  # type: ignore[union-attr]
            "global_step": trainer.global_step,
            "is_global_zero": trainer.is_global_zero,
            "world_size": trainer.world_size,
        },
        out / f"weights.{rank}.pt",
    )


if __name__ == "__main__":
    main()
