"""Training throughput of the executor against its anchors (Horovod synthetic-benchmark method).

    .venv/bin/python benchmarks/training_throughput.py [--rounds 5]

(a) one process, 4 local replicas of micro-batch 32 (popdist_torch) against a plain torch
    loop on a batch of 128;
(b) 2 processes x 1 replica, micro-batch 64 each (global batch 128): popdist_torch under
    poprun, torchrun + DistributedDataParallel (gloo), and a Horovod DistributedOptimizer
    loop under mpirun.

Same MLP (784-1024-512-10, 1.33 M parameters), SGD, one fixed synthetic batch, one compute
thread per process.  Each launch warms up, then times ``--iters`` iterations of
``--batches`` steps and reports the median of the global samples/s; cases are launched
in rotating order for ``--rounds`` rounds and the table shows the median over rounds.
Results go to docs/training-throughput.md.  ``--worker`` is the per-process entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MICRO_A, REPLICAS_A = 32, 4
MICRO_B, PROCESSES_B = 64, 2


def _model() -> object:
    import torch
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10)
            )

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.net(x)
            return out, nn.functional.cross_entropy(out, y)

    torch.manual_seed(0)
    return Mlp()


def _time(
    step: Callable[[], None], samples_per_step: int, warmup: int, iters: int, batches: int
) -> float:
    """Median samples/s over ``iters`` timed iterations of ``batches`` steps."""
    for _ in range(warmup):
        step()
    rates = []
    for _ in range(iters):
        t0 = time.perf_counter()
        for _ in range(batches):
            step()
        rates.append(samples_per_step * batches / (time.perf_counter() - t0))
    return statistics.median(rates)


def worker(kind: str, warmup: int, iters: int, batches: int) -> None:
    import torch

    torch.set_num_threads(1)
    model: Any = _model()
    rank, size = 0, 1
    if kind == "plain":
        batch = MICRO_A * REPLICAS_A
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad()
            model(x, y)[1].backward()
            opt.step()

    elif kind in ("executor", "executor-dist"):
        import popdist_torch as poptorch

        if kind == "executor":
            opts = poptorch.Options().replicationFactor(REPLICAS_A)
            batch = MICRO_A * REPLICAS_A
        else:
            import popdist
            import popdist.poptorch

            popdist.init()
            opts = popdist.poptorch.Options()
            batch = MICRO_B * opts.replication_factor
        rank, size = opts.Distributed.processId, opts.Distributed.numProcesses
        wrapped = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))

        def step() -> None:
            wrapped(x, y)

    elif kind == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        batch = MICRO_B

        def step() -> None:
            opt.zero_grad()
            ddp(x, y)[1].backward()
            opt.step()

    elif kind == "horovod":
        import horovod.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
        )
        batch = MICRO_B

        def step() -> None:
            opt.zero_grad()
            model(x, y)[1].backward()
            opt.step()

    else:
        raise SystemExit(f"unknown worker {kind!r}")
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 784, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    rate = _time(step, batch * size, warmup, iters, batches)
    if rank == 0:
        print("RESULT " + json.dumps({"kind": kind, "samples_per_s": rate}), flush=True)
    if kind == "ddp":
        import torch.distributed as dist

        dist.destroy_process_group()


Any = object  # annotation placeholder for the dynamically built model


def _launch(argv: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "OMPI_", "PMIX_"))}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    match = re.search(r"RESULT (\{.*\})", proc.stdout)
    if proc.returncode != 0 or not match:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    return float(json.loads(match.group(1))["samples_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    timing = [
        "--warmup",
        str(args.warmup),
        "--iters",
        str(args.iters),
        "--batches",
        str(args.batches),
    ]
    if args.worker:
        worker(args.worker, args.warmup, args.iters, args.batches)
        return

    from benchmarks._common import MPIRUN_BASE, interleave, table, which, write_doc

    py, me = sys.executable, str(Path(__file__).resolve())
    cases: dict[str, list[str]] = {
        "a: plain torch, batch 128": [py, me, "--worker", "plain", *timing],
        "a: popdist_torch, 1 x 4 replicas x 32": [py, me, "--worker", "executor", *timing],
        "b: popdist_torch, poprun 2 x 1 x 64": [
            which("poprun"), "--num-instances", "2", "--num-replicas", "2",
            py, me, "--worker", "executor-dist", *timing,
        ],
        "b: torchrun + DDP (gloo), 2 x 64": [
            which("torchrun"), "--standalone", "--nproc-per-node", "2", me, "--worker", "ddp", *timing,
        ],
        "b: Horovod DistributedOptimizer, mpirun 2 x 64": [
            *MPIRUN_BASE, "-np", "2", py, me, "--worker", "horovod", *timing,
        ],
    }  # fmt: skip
    results = interleave(
        {name: (lambda argv=argv: _launch(argv)) for name, argv in cases.items()}, args.rounds
    )
    names = list(cases)
    med = {n: results[n].median for n in names}
    rows = [[n, f"{med[n]:.0f}", f"{results[n].iqr:.0f}", len(results[n].samples)] for n in names]
    ratio_a = med[names[1]] / med[names[0]]
    ratio_ddp = med[names[2]] / med[names[3]]
    ratio_hvd = med[names[2]] / med[names[4]]
    body = "\n\n".join(
        [
            __doc__.split("\n\n", 1)[1].rsplit("\n\n", 0)[0].strip(),
            table(["case", "samples/s (median)", "IQR", "rounds"], rows),
            table(
                ["ratio", "value", "target"],
                [
                    ["(a) popdist_torch 1x4 / plain torch", f"{ratio_a:.3f}", ">= 0.9"],
                    ["(b) popdist_torch 2x1 / torchrun + DDP", f"{ratio_ddp:.3f}", ">= 1.0"],
                    [
                        "(b) popdist_torch 2x1 / Horovod DistributedOptimizer",
                        f"{ratio_hvd:.3f}",
                        ">= 1.0",
                    ],
                ],
            ),
        ]
    )
    path = write_doc("training-throughput.md", "Training throughput", body)
    print(body)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
