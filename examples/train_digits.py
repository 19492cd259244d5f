"""Train a small classifier on scikit-learn's digits, data-parallel over poprun instances.

    poprun --num-instances 2 --num-replicas 4 python examples/train_digits.py
    poprun --num-instances 2 --num-replicas 4 --backend torch python examples/train_digits.py
    python examples/train_digits.py            # one process, one replica

Each instance trains its local replicas on its shard of every global batch (the
DataLoader shards, the executor averages gradients over replicas and instances), shows
a progress bar on instance 0 only, evaluates the shared weights with an inference model,
sums the correct answers of all instances and prints the global test accuracy.  It exits
non-zero if the instances do not end with identical weights.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import TensorDataset
from tqdm import tqdm

import popdist
import popdist.poptorch
import popdist_torch as poptorch


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> object:
        logits = self.net(x)
        if labels is None:
            return logits
        return logits, F.cross_entropy(logits, labels)


def datasets() -> tuple[TensorDataset, TensorDataset]:
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x / 16.0, y, test_size=0.25, random_state=0)

    def to_dataset(a: object, b: object) -> TensorDataset:
        return TensorDataset(torch.tensor(a, dtype=torch.float32), torch.tensor(b))

    return to_dataset(x_train, y_train), to_dataset(x_test, y_test)


def evaluate(model: nn.Module, opts: poptorch.Options, test: TensorDataset) -> tuple[int, int]:
    """Correct answers and samples of this instance's shard of the test set."""
    inference = poptorch.inferenceModel(model, opts)
    with warnings.catch_warnings():  # the short last batch is padded below
        warnings.filterwarnings("ignore", message=".*last combined batch.*")
        loader = poptorch.DataLoader(opts, test, batch_size=8, drop_last=False)
    step = opts.replication_factor * opts.device_iterations
    correct = total = 0
    for x, y in loader:
        n = x.shape[0]
        pad = -n % step  # the last batch may be short: pad it, ignore the padding
        if pad:
            x = torch.cat([x, x[:1].expand(pad, -1)])
        predictions = inference(x)[:n].argmax(dim=1)
        correct += int((predictions == y).sum())
        total += n
    return correct, total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=8, help="micro-batch per replica")
    parser.add_argument("--lr", type=float, default=0.005)
    args = parser.parse_args()

    distributed = popdist.isPopdistEnvSet()
    if distributed:
        popdist.init()
        opts = popdist.poptorch.Options()
    else:
        opts = poptorch.Options()
    opts.randomSeed(0)  # same shuffling on every instance
    rank, size = opts.Distributed.processId, opts.Distributed.numProcesses

    train, test = datasets()
    torch.manual_seed(1234 + rank)  # instances differ here; the wrap broadcasts instance 0's
    model = Classifier()
    test_opts = opts.clone()
    loader = poptorch.DataLoader(opts, train, batch_size=args.batch_size, shuffle=True)
    training = poptorch.trainingModel(
        model, opts, poptorch.optim.AdamW(model.parameters(), lr=args.lr)
    )
    for epoch in range(args.epochs):
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", disable=rank != 0)
        for x, y in bar:
            _, losses = training(x, y)
            # refresh=False: the bar redraws itself (at most every 0.1 s) with the right count
            bar.set_postfix(loss=f"{float(losses.mean()):.3f}", refresh=False)

    correct, total = evaluate(model, test_opts, test)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    identical = True
    if size > 1:
        # The run's collectives, whichever backend poprun --backend chose (Horovod or torch).
        collectives = popdist.collectives.for_run()
        counts = collectives.allreduce_(torch.tensor([correct, total]), name="accuracy")
        correct, total = (int(c) for c in counts)
        every = collectives.allgather(weights.unsqueeze(0), name="weights")
        identical = bool((every == every[0]).all())
    if rank == 0:
        print(
            f"global test accuracy {correct / total:.4f} ({correct}/{total} samples, "
            f"{size} instance(s) x {opts.replication_factor} replica(s))"
        )
        print("weights identical on every instance" if identical else "WEIGHTS DIFFER")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
