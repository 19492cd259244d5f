"""What the deterministic reduction costs training (issue 31): the same job, mode on and off.

    .venv/bin/python benchmarks/deterministic.py [--launches 3] [--pairs 4] [--block 20]

6 replicas of an MLP (784-256-10, micro-batch 16, SGD, one fixed synthetic batch, one
compute thread a process) as 1 instance × 6 and 2 instances × 3, launched by poprun. Inside
each launch one module is wrapped twice, by the default path and with
``Training.deterministicReduction()``, and the instances alternate blocks of ``--block``
steps between the two (default, deterministic, deterministic, default, ...), so the load of
the machine hits both alike; the ratio deterministic/default is taken per pair of blocks,
then the median over pairs and launches. Writes docs/deterministic-reduction.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPLICAS, MICRO = 6, 16
SPLITS = {"1x6": 1, "2x3": 2}


def within(pairs: int, block: int, warmup: int) -> None:
    """One instance: ``pairs`` pairs of timed blocks, default and deterministic in turn.

    Rank 0 prints ``RESULT {"default": [...], "deterministic": [...]}`` (samples/s a block).
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    import popdist
    import popdist.poptorch
    import popdist_torch as poptorch

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(784, 256), nn.Linear(256, 10)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.fc2(torch.relu(self.fc1(x)))
            return out, F.cross_entropy(out, y)

    torch.manual_seed(0)
    model = Mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    wrapped = {}
    for mode in ("default", "deterministic"):
        opts = popdist.poptorch.Options()
        opts.Training.deterministicReduction(mode == "deterministic")
        wrapped[mode] = poptorch.trainingModel(model, opts, optimizer)
    local = popdist.getNumLocalReplicas()
    x = torch.randn(local * MICRO, 784)
    y = torch.randint(0, 10, (local * MICRO,))

    def timed(mode: str, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            wrapped[mode](x, y)
        return REPLICAS * MICRO * steps / (time.perf_counter() - start)

    for mode in wrapped:
        timed(mode, warmup)
    rates: dict[str, list[float]] = {"default": [], "deterministic": []}
    for p in range(pairs):
        order = ("default", "deterministic") if p % 2 == 0 else ("deterministic", "default")
        for mode in order:
            rates[mode].append(timed(mode, block))
    if popdist.getInstanceIndex() == 0:
        print("RESULT " + json.dumps(rates), flush=True)


def _launch(split: str, args: argparse.Namespace) -> dict[str, list[float]]:
    from benchmarks import training_throughput as tt
    from benchmarks._common import which

    argv = [
        which("poprun"), "--num-instances", str(SPLITS[split]), "--num-replicas", str(REPLICAS),
        sys.executable, str(Path(__file__).resolve()), "--worker", "--pairs", str(args.pairs),
        "--block", str(args.block), "--warmup", str(args.warmup),
    ]  # fmt: skip
    return tt.launch_result(argv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=4, help="block pairs a launch")
    parser.add_argument("--block", type=int, default=20, help="steps a block")
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if args.worker:
        within(args.pairs, args.block, args.warmup)
        return

    from benchmarks._common import Summary, save_results, table, write_doc

    out: dict[str, Any] = {"launches": args.launches, "pairs": args.pairs, "block": args.block}
    rows = []
    for split in SPLITS:
        default: list[float] = []
        deterministic: list[float] = []
        for _ in range(args.launches):
            got = _launch(split, args)
            default += got["default"]
            deterministic += got["deterministic"]
        ratios = [a / b for a, b in zip(deterministic, default, strict=True)]
        out[split] = {
            "default": default,
            "deterministic": deterministic,
            "ratios": ratios,
            "ratio": statistics.median(ratios),
        }
        d, r = Summary(tuple(default)), Summary(tuple(deterministic))
        q = Summary(tuple(ratios))
        rows.append([
            split, f"{d.median:.0f} (IQR {d.iqr:.0f})", f"{r.median:.0f} (IQR {r.iqr:.0f})",
            f"{q.median:.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}, n={len(ratios)})",
        ])  # fmt: skip
    save_results("deterministic-reduction", out)
    body = (
        "Training throughput (samples/s over the 6 replicas) of the default reduction and of "
        "the deterministic reduction (`Training.deterministicReduction()`, `poprun "
        "--deterministic-reduction`), the same module wrapped both ways in one launch, blocks "
        f"of {args.block} steps alternating, {args.pairs} pairs a launch, {args.launches} "
        "launches (medians, IQR; ratio per pair). The machine is shared with other work while "
        "this runs: the ratio is taken within each pair of neighbouring blocks for that "
        "reason.\n\n"
        + table(
            ["instances × replicas", "default", "deterministic", "deterministic / default"], rows
        )
        + "\n"
    )
    write_doc("deterministic-reduction.md", "Deterministic reduction: its cost", body)


if __name__ == "__main__":
    main()
