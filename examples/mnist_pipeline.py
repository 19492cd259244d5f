"""Pipelined training and inference of a small CNN on scikit-learn's digits.

The model is split into four blocks (B1..B4) with ``Block`` contexts; two stages of
two blocks run on the replica's two devices (CPU workers here, GPUs when present).
``--strategy sharded`` runs the same stages one at a time, for comparison and
debugging.  Under ``poprun --num-replicas 2 --ipus-per-replica 2`` each replica is
pipelined and the replicas train data-parallel.

    .venv/bin/python examples/mnist_pipeline.py
    .venv/bin/python examples/mnist_pipeline.py --strategy sharded --profile --profile-dir sharded
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import popdist
import popdist.poptorch
import popdist_torch as poptorch
from popdist_torch.data import DataLoader
from popdist_torch.pipeline import (
    Block,
    PipelinedExecution,
    ShardedExecution,
    Stage,
    StageEvent,
    chrome_trace,
    record_schedule,
)

log = logging.getLogger("mnist_pipeline")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8, help="micro-batch size for training")
    p.add_argument("--device-iterations", type=int, default=2, help="training device iterations")
    p.add_argument("--gradient-accumulation", type=int, default=8, help="micro-batches per update")
    p.add_argument("--test-batch-size", type=int, default=8, help="micro-batch size for inference")
    p.add_argument("--test-device-iterations", type=int, default=5)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--learning-rate", type=float, default=0.002, help="AdamW learning rate")
    p.add_argument("--strategy", choices=("pipelined", "sharded"), default="pipelined")
    p.add_argument(
        "--offload-optimiser", action="store_true", help="keep optimizer state off-device"
    )
    p.add_argument("--profile", action="store_true", help="write a Chrome trace and a timeline PNG")
    p.add_argument("--profile-dir", type=Path, default=Path("profile"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--debug", action="store_true", help="log the stages and every step")
    return p.parse_args(argv)


class ConvLayer(nn.Module):
    """Convolution, max-pool, ReLU."""

    def __init__(self, in_channels: int, num_filters: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, num_filters, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(kernel_size=2)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.pool(self.conv(x)))


class Network(nn.Module):
    """Four blocks: two convolution layers and two linear layers on 8x8 digits."""

    def __init__(self) -> None:
        super().__init__()
        self.layer1 = ConvLayer(1, 16)
        self.layer2 = ConvLayer(16, 32)
        self.layer3 = nn.Linear(128, 64)
        self.layer3_act = nn.ReLU()
        self.layer4 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with Block("B1"):
            x = self.layer1(x)
        with Block("B2"):
            x = self.layer2(x)
        with Block("B3"):
            x = x.flatten(1)
            x = self.layer3_act(self.layer3(x))
        with Block("B4"):
            x = self.layer4(x)
        return x


class TrainingModelWithLoss(nn.Module):
    """The network plus its loss, computed in the last block."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        output = self.model(x)
        if labels is None:
            return output
        with Block("B4"):
            loss = self.loss(output, labels)
        return output, loss


def digits(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn's 1797 8x8 digits, scaled to [0, 1], split 80/20 with a fixed seed."""
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(labels))
    train, test = order[:cut], order[cut:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


def make_options() -> poptorch.Options:
    """Under poprun: replicas, instance and --ipus-per-replica from the launch."""
    if popdist.isPopdistEnvSet():
        return popdist.poptorch.Options()
    return poptorch.Options()  # the replica's devices are the ones the stages name


def strategy(name: str) -> PipelinedExecution | ShardedExecution:
    stages = (Stage("B1", "B2").ipu(0), Stage("B3", "B4").ipu(1))
    return PipelinedExecution(*stages) if name == "pipelined" else ShardedExecution(*stages)


def accuracy(predictions: torch.Tensor, labels: torch.Tensor) -> float:
    """Percentage of correct predictions (the last ``len(predictions)`` labels)."""
    predictions = predictions.reshape(-1, predictions.shape[-1])
    labels = labels[-predictions.shape[0] :]
    return float((predictions.argmax(-1) == labels).float().mean().item() * 100.0)


def train(
    args: argparse.Namespace, model: nn.Module, dataset: TensorDataset
) -> list[list[StageEvent]]:
    opts = make_options()
    opts.deviceIterations(args.device_iterations)
    opts.Training.gradientAccumulation(args.gradient_accumulation)
    opts.outputMode(poptorch.OutputMode.All)
    opts.randomSeed(args.seed)
    opts.setExecutionStrategy(strategy(args.strategy))
    if args.offload_optimiser:
        opts.TensorLocations.setOptimizerLocation(
            poptorch.TensorLocationSettings().useOnChipStorage(False)
        )
    loader = DataLoader(opts, dataset, batch_size=args.batch_size, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    training_model = poptorch.trainingModel(TrainingModelWithLoss(model), opts, optimizer=optimizer)
    schedules: list[list[StageEvent]] = []
    for epoch in range(1, args.epochs + 1):
        losses, accs = [], []
        for data, labels in loader:
            with record_schedule() as events:
                preds, loss = training_model(data, labels)
            if args.profile:
                schedules.append(events)
            losses.append(float(torch.as_tensor(loss).float().mean()))
            accs.append(accuracy(preds, labels))
            log.debug("epoch %d step %d: loss %.4f", epoch, len(losses), losses[-1])
        print(
            f"Epoch {epoch}/{args.epochs}: loss {sum(losses) / len(losses):.4f}, "
            f"training accuracy {sum(accs) / len(accs):.2f}%"
        )
    return schedules


def test(args: argparse.Namespace, model: nn.Module, dataset: TensorDataset) -> float:
    opts = make_options()
    opts.deviceIterations(args.test_device_iterations)
    opts.setExecutionStrategy(strategy(args.strategy))
    loader = DataLoader(opts, dataset, batch_size=args.test_batch_size, drop_last=False)
    inference_model = poptorch.inferenceModel(model, opts)
    correct = total = 0
    for data, labels in loader:
        output = inference_model(data)
        correct += int((output.argmax(-1) == labels).sum())
        total += len(labels)
    acc = 100.0 * correct / total
    shard = " (this instance's shard)" if popdist.getNumInstances() > 1 else ""
    print(f"Accuracy on test set{shard}: {acc:.2f}% ({correct}/{total})")
    return acc


def write_profile(directory: Path, schedules: list[list[StageEvent]]) -> None:
    """A Chrome trace of every training step and a PNG timeline of the last one."""
    directory.mkdir(parents=True, exist_ok=True)
    events = [e for step in schedules for e in step]
    (directory / "schedule.json").write_text(json.dumps(chrome_trace(events)))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    last = schedules[-1]
    origin = min(e.start for e in last)
    stages = sorted({e.stage for e in last})
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(stages)))
    for e in last:
        start, width = (e.start - origin) * 1e3, (e.end - e.start) * 1e3
        ax.broken_barh(
            [(start, width)],
            (e.stage - 0.4, 0.8),
            color="tab:green" if e.kind == "F" else "tab:red",
        )
        ax.text(
            start + width / 2,
            e.stage,
            f"{e.kind}{e.micro_batch}",
            ha="center",
            va="center",
            fontsize=6,
            color="white",
        )
    ax.set_yticks(stages, [f"stage {s}" for s in stages])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title("last training call: forward (green) and backward (red) of each micro-batch")
    fig.tight_layout()
    fig.savefig(directory / "timeline.png", dpi=120)
    plt.close(fig)
    print(f"Profile written to {directory}/schedule.json and {directory}/timeline.png")


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING)
    torch.manual_seed(args.seed)
    train_set, test_set = digits(args.seed)
    model = Network()
    log.debug("strategy: %r", strategy(args.strategy))
    start = time.perf_counter()
    schedules = train(args, model, train_set)
    print(f"Training took {time.perf_counter() - start:.1f} s ({args.strategy})")
    if args.profile:
        write_profile(args.profile_dir, schedules)
    return test(args, model.eval(), test_set)


if __name__ == "__main__":
    main()
