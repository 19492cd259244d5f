"""Training throughput of the executor against its anchors (Horovod synthetic-benchmark method).

    .venv/bin/python benchmarks/training_throughput.py [--rounds 3] [--models mlp,cnn]

For each model (an MLP 784-1024-512-10 of 1.33 M parameters, and a small CNN on 1x28x28:
conv 16, conv 32, pool, linear 128, linear 10), SGD, one fixed synthetic batch, one
compute thread per process:

- plain single-process torch on a batch of 64 (the 1-instance anchor) and of 128;
- popdist_torch under poprun: 1 instance x 1 replica x 64, 1 instance x 4 local replicas
  x 32 (issue 5: against plain torch on 128), 2 instances x 1 replica x 64;
- torchrun + DistributedDataParallel (gloo), 1 and 2 processes x 64;
- horovodrun + ``hvd.DistributedOptimizer``, 1 and 2 processes x 64;
- the anchors of the goals (which are the cases above, as users run them) again under the
  executor's conditions, so that a ratio against them takes the launcher's tuning out and
  measures the executor alone: plain torch on 128 launched by poprun
  (1 instance x 1 replica: same launcher, same environment), and DDP and Horovod on 2
  processes with the glibc malloc settings poprun gives its instances (``poprun.plan.environment``).

Each launch warms up, then times ``--iters`` iterations of ``--batches`` steps and reports
the median of the global samples/s (rank 0's clock; every step ends in a collective, so
the ranks run in lockstep), and rank 0's minor page faults per step. Every case starts from glibc's default malloc (any ``MALLOC_*``
or ``GLIBC_TUNABLES`` of the caller's is dropped). Cases run in rotating order for ``--rounds`` rounds; tables
show the median over rounds and its spread; a ratio is taken within each round, then the
median over rounds, so drift in the machine's load cancels. Scaling efficiency = thr(2) /
(2 thr(1)) of the same framework. Writes docs/training-throughput.{md,json,png}.
``--worker`` is the per-process entry point.
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MICRO = 64  # per process / per replica, except the 4-replica case
MICRO_LOCAL, LOCAL_REPLICAS = 32, 4


def _model(name: str) -> Any:
    import torch
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10)
            )

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.net(x.flatten(1))
            return out, nn.functional.cross_entropy(out, y)

    class Cnn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            )  # fmt: skip
            self.head = nn.Sequential(
                nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)
            )

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.head(self.features(x))
            return out, nn.functional.cross_entropy(out, y)

    class SmallMlp(nn.Module):
        """A fast step: few, small gradients (progress_overhead's fast-step case, issue 33)."""

        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.net(x.flatten(1))
            return out, nn.functional.cross_entropy(out, y)

    torch.manual_seed(0)
    return {"mlp": Mlp, "cnn": Cnn, "mlp-small": SmallMlp}[name]()


def _time(
    step: Callable[[], None], samples_per_step: int, warmup: int, iters: int, batches: int
) -> tuple[float, float]:
    """Median samples/s over ``iters`` timed iterations of ``batches`` steps, and the minor
    page faults per timed step (warm-up excluded: its first touches are not steady state)."""
    import resource

    for _ in range(warmup):
        step()
    rates = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(iters):
        t0 = time.perf_counter()
        for _ in range(batches):
            step()
        rates.append(samples_per_step * batches / (time.perf_counter() - t0))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return statistics.median(rates), faults / (iters * batches)


def worker(kind: str, model_name: str, batch: int, warmup: int, iters: int, batches: int) -> None:
    """One process of one case; rank 0 prints ``RESULT {json}``."""
    import torch

    torch.set_num_threads(1)
    model = _model(model_name)
    rank, size = 0, 1
    if kind == "plain":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad()
            model(x, y)[1].backward()
            opt.step()

    elif kind == "executor":
        import popdist
        import popdist.poptorch
        import popdist_torch as poptorch

        if popdist.getNumInstances() > 1:
            popdist.init()
        opts = popdist.poptorch.Options()
        batch = batch * opts.replication_factor
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

        def step() -> None:
            opt.zero_grad()
            model(x, y)[1].backward()
            opt.step()

    else:
        raise SystemExit(f"unknown worker {kind!r}")
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    rate, faults = _time(step, batch * size, warmup, iters, batches)
    if rank == 0:
        result = {"kind": kind, "samples_per_s": rate, "faults_per_step": faults}
        print("RESULT " + json.dumps(result), flush=True)
    if kind == "ddp":
        import gc

        import torch.distributed as dist

        # Tear down in order, or gloo's threads sometimes abort the exit ("terminate called
        # without an active exception", about 1 launch in 6): both ranks done, then the
        # DDP reducer gone, then the process group.
        dist.barrier()
        del step, ddp
        gc.collect()
        dist.destroy_process_group()


def _launch(
    argv: list[str], baseline: str | None = None, extra: dict[str, str] | None = None
) -> tuple[float, float]:
    """One launch: rank 0's samples/s and its minor page faults per step."""
    result = launch_result(argv, baseline, extra)
    return float(result["samples_per_s"]), float(result["faults_per_step"])


def launch_result(
    argv: list[str], baseline: str | None = None, extra: dict[str, str] | None = None
) -> dict[str, Any]:
    """One launch of a worker, one compute thread a process: what rank 0 printed after
    ``RESULT``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("POPDIST_", "OMPI_", "PMIX_", "HOROVOD_", "MALLOC_"))
        and k != "GLIBC_TUNABLES"
    }
    env.update(extra or {})
    env["OMP_NUM_THREADS"] = "1"
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [baseline, os.environ.get("PYTHONPATH"), root])
    )
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    match = re.search(r"RESULT (\{.*\})", proc.stdout)
    if proc.returncode != 0 or not match:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    result: dict[str, Any] = json.loads(match.group(1))
    return result


#: case key -> (label, processes, launcher, worker kind, per-process/replica micro-batch)
CASES: dict[str, tuple[str, int, str, str, int]] = {
    "plain-64": ("plain torch, 1 process, batch 64", 1, "python", "plain", MICRO),
    "plain-128": ("plain torch, 1 process, batch 128", 1, "python", "plain", 2 * MICRO),
    "popdist-1x1": ("popdist_torch, poprun 1 instance x 1 replica x 64", 1, "poprun", "executor", MICRO),
    "popdist-1x4": ("popdist_torch, poprun 1 instance x 4 replicas x 32", 1, "poprun4", "executor", MICRO_LOCAL),
    "popdist-2x1": ("popdist_torch, poprun 2 instances x 1 replica x 64", 2, "poprun", "executor", MICRO),
    "ddp-1": ("torchrun + DDP (gloo), 1 x 64", 1, "torchrun", "ddp", MICRO),
    "ddp-2": ("torchrun + DDP (gloo), 2 x 64", 2, "torchrun", "ddp", MICRO),
    "hvd-1": ("horovodrun + DistributedOptimizer, 1 x 64", 1, "horovodrun", "horovod", MICRO),
    "hvd-2": ("horovodrun + DistributedOptimizer, 2 x 64", 2, "horovodrun", "horovod", MICRO),
    "plain-128-poprun": ("plain torch, batch 128, launched by poprun (1 x 1)", 1, "poprun", "plain", 2 * MICRO),
}  # fmt: skip
#: The torch backend's case: it runs when asked for (--cases, benchmarks/torch_backend.py).
TORCH_CASE = "popdist-2x1-torch"
CASES[TORCH_CASE] = (
    "popdist_torch --backend torch, poprun 2 instances x 1 replica x 64", 2, "poprun-torch",
    "executor", MICRO,
)  # fmt: skip
#: Anchors measured again with poprun's allocator settings (case key + SAME_ALLOCATOR).
SAME_ALLOCATOR = "-alloc"
for _key in ("ddp-2", "hvd-2"):
    _label, *_rest = CASES[_key]
    CASES[_key + SAME_ALLOCATOR] = (f"{_label}, poprun's malloc settings", *_rest)  # type: ignore[assignment]
#: What a run without --cases measures.
DEFAULT_CASES = [key for key in CASES if key != TORCH_CASE]


def _argv(case: str, model: str, timing: list[str]) -> list[str]:
    from benchmarks._common import which

    _, n, launcher, kind, micro = CASES[case.removesuffix(SAME_ALLOCATOR)]
    py, me = sys.executable, str(Path(__file__).resolve())
    tail = [me, "--worker", kind, "--model", model, "--batch", str(micro), *timing]
    if launcher == "python":
        return [py, *tail]
    if launcher in ("poprun", "poprun4", "poprun-torch"):
        replicas = LOCAL_REPLICAS if launcher == "poprun4" else n
        poprun = [which("poprun"), "--num-instances", str(n), "--num-replicas", str(replicas)]
        if launcher == "poprun-torch":
            poprun += ["--backend", "torch"]
        return [*poprun, py, *tail]
    if launcher == "torchrun":
        return [which("torchrun"), "--standalone", "--nproc-per-node", str(n), *tail]
    return [which("horovodrun"), "-np", str(n), py, *tail]


#: ratio key -> (case, anchor case, anchor factor). Scaling efficiency = thr(2) / (2 thr(1)).
RATIOS: dict[str, tuple[str, str, float]] = {
    "local_replicas_1x4_vs_plain_128_under_poprun": ("popdist-1x4", "plain-128-poprun", 1.0),
    "local_replicas_1x4_vs_plain_128": ("popdist-1x4", "plain-128", 1.0),
    "popdist_1x1_vs_plain_64": ("popdist-1x1", "plain-64", 1.0),
    "popdist_2x1_vs_ddp_2_same_allocator": ("popdist-2x1", "ddp-2-alloc", 1.0),
    "popdist_2x1_vs_ddp_2": ("popdist-2x1", "ddp-2", 1.0),
    "popdist_2x1_torch_vs_ddp_2": ("popdist-2x1-torch", "ddp-2", 1.0),
    "popdist_2x1_torch_vs_horovod": ("popdist-2x1-torch", "popdist-2x1", 1.0),
    "popdist_2x1_vs_hvd_2_same_allocator": ("popdist-2x1", "hvd-2-alloc", 1.0),
    "popdist_2x1_vs_hvd_2": ("popdist-2x1", "hvd-2", 1.0),
    "scaling_popdist": ("popdist-2x1", "popdist-1x1", 2.0),
    "scaling_ddp": ("ddp-2", "ddp-1", 2.0),
    "scaling_hvd": ("hvd-2", "hvd-1", 2.0),
    "popdist_2x1_vs_plain_64": ("popdist-2x1", "plain-64", 1.0),
    "plain_128_poprun_vs_python": ("plain-128-poprun", "plain-128", 1.0),
}


def ratios(samples: dict[str, list[float]]) -> dict[str, float]:
    """The derived figures of one model whose cases ran: each taken per round, then the
    median over rounds."""
    return {
        key: statistics.median(
            x / (factor * y) for x, y in zip(samples[case], samples[anchor], strict=True)
        )
        for key, (case, anchor, factor) in RATIOS.items()
        if case in samples and anchor in samples
    }


RATIO_LABELS = {
    "local_replicas_1x4_vs_plain_128_under_poprun": (
        "popdist_torch 1x4x32 / plain torch batch 128, both launched by poprun", ""),
    "local_replicas_1x4_vs_plain_128": ("popdist_torch 1x4x32 / plain torch batch 128, as run", ">= 0.9"),
    "popdist_1x1_vs_plain_64": ("popdist_torch 1x1 / plain torch (1-instance overhead)", ""),
    "popdist_2x1_vs_ddp_2_same_allocator": (
        "popdist_torch 2x1 / torchrun + DDP 2, same malloc settings", ""),
    "popdist_2x1_vs_ddp_2": ("popdist_torch 2x1 / torchrun + DDP 2, as run", ">= 1.0"),
    "popdist_2x1_torch_vs_ddp_2": ("popdist_torch 2x1 --backend torch / torchrun + DDP 2", ">= 1.0"),
    "popdist_2x1_torch_vs_horovod": ("popdist_torch 2x1, --backend torch / --backend horovod", ""),
    "popdist_2x1_vs_hvd_2_same_allocator": (
        "popdist_torch 2x1 / Horovod DistributedOptimizer 2, same malloc settings", ""),
    "popdist_2x1_vs_hvd_2": ("popdist_torch 2x1 / Horovod DistributedOptimizer 2, as run", ">= 1.0"),
    "scaling_popdist": ("scaling efficiency popdist_torch, 2 vs 1", ""),
    "scaling_ddp": ("scaling efficiency torchrun + DDP, 2 vs 1", ""),
    "scaling_hvd": ("scaling efficiency Horovod, 2 vs 1", ""),
    "popdist_2x1_vs_plain_64": ("popdist_torch 2 instances / plain 1 process", ""),
    "plain_128_poprun_vs_python": ("plain torch batch 128, launched by poprun / by python", ""),
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=MICRO, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--at-least", type=int, help="with --budget: rounds past this many run only within it"
    )
    parser.add_argument(
        "--budget", type=float, default=0.0, help="seconds the rounds past --at-least may take"
    )
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument(
        "--cases", default=",".join(DEFAULT_CASES), help="comma-separated case keys"
    )
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--label", default="", help="suffix of the output files")
    parser.add_argument(
        "--baseline", help="packages of an earlier commit: adds a popdist-2x1-before case"
    )
    args = parser.parse_args()
    timing = ["--warmup", str(args.warmup), "--iters", str(args.iters)]
    timing += ["--batches", str(args.batches)]
    if args.worker:
        worker(args.worker, args.model, args.batch, args.warmup, args.iters, args.batches)
        return

    from benchmarks._common import DOCS, interleave, save_results, table, write_doc

    models = args.models.split(",")
    keys = args.cases.split(",")
    if args.baseline:
        CASES["popdist-2x1-before"] = (
            "popdist_torch 2 x 1 x 64, before tuning",
            *CASES["popdist-2x1"][1:],
        )
        keys.append("popdist-2x1-before")
    argvs = {f"{m}/{k}": _argv(k, m, timing) for m in models for k in keys}
    from poprun.plan.environment import allocator_defaults

    same_allocator = allocator_defaults({})  # what poprun adds for an environment without any

    faults: dict[str, list[float]] = {name: [] for name in argvs}

    def case(name: str, argv: list[str]) -> Callable[[], float]:
        baseline = args.baseline if "before" in name else None
        extra = same_allocator if name.endswith(SAME_ALLOCATOR) else None

        def launch() -> float:
            rate, per_step = _launch(argv, baseline, extra)
            faults[name].append(per_step)
            return rate

        return launch

    cases = {name: case(name, argv) for name, argv in argvs.items()}
    results = interleave(cases, args.rounds, budget_s=args.budget, at_least=args.at_least)
    ran = len(next(iter(results.values())).samples)  # fewer than asked on a slow machine
    out: dict[str, Any] = {"rounds": ran, "timing": timing, "models": {}}
    sections = []
    for m in models:
        med = {k: results[f"{m}/{k}"].median for k in keys}
        rows = [
            [
                CASES[k][0],
                f"{med[k]:.0f}",
                f"{results[f'{m}/{k}'].iqr:.0f}",
                f"{min(results[f'{m}/{k}'].samples):.0f}–{max(results[f'{m}/{k}'].samples):.0f}",
                f"{statistics.median(faults[f'{m}/{k}']):.0f}",
            ]
            for k in keys
        ]
        samples = {k: list(results[f"{m}/{k}"].samples) for k in keys}
        got = ratios(samples)
        out["models"][m] = {
            "samples_per_s": samples,
            "median": med,
            "ratios": got,
            "faults_per_step": {k: faults[f"{m}/{k}"] for k in keys},
        }
        text = f"### {m.upper()}\n\n" + table(
            ["case", "samples/s (median)", "IQR", "min–max", "page faults / step"], rows
        )
        if got:
            text += "\n\n" + table(
                ["ratio", "value", "target"],
                [[RATIO_LABELS[r][0], f"{v:.3f}", RATIO_LABELS[r][1]] for r, v in got.items()],
            )
        sections.append(text)
    suffix = f"-{args.label}" if args.label else ""
    save_results(f"training-throughput{suffix}", out)
    if set(DEFAULT_CASES) <= set(keys):
        _plot(out, DOCS / f"training-throughput{suffix}.png")
    body = "\n\n".join(
        [
            __doc__.split("\n\n", 2)[2].strip(),
            f"{ran} rounds; per launch {' '.join(timing)}.",
            *sections,
            "![training throughput](training-throughput.png)"
            if set(DEFAULT_CASES) <= set(keys)
            else "",
        ]
    )
    path = write_doc(f"training-throughput{suffix}.md", "Training throughput", body)
    print(body)
    print(f"\nwritten to {path}")


def _plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(out["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models, strict=True):
        med = out["models"][m]["median"]
        groups = [
            ("1 process", ["plain-64", "popdist-1x1", "ddp-1", "hvd-1"]),
            ("2 processes", ["popdist-2x1", "ddp-2", "ddp-2-alloc", "hvd-2", "hvd-2-alloc"]),
            ("4 local replicas", ["plain-128", "plain-128-poprun", "popdist-1x4"]),
        ]
        colours = {"plain": "grey", "popdist": "tab:blue", "ddp": "tab:orange", "hvd": "tab:green"}
        x = 0.0
        ticks, labels = [], []
        for title, keys in groups:
            for k in keys:
                # hatched: run with poprun's malloc settings
                hatch = "//" if k.endswith((SAME_ALLOCATOR, "-poprun")) else None
                ax.bar(x, med[k], color=colours[k.split("-")[0]], width=0.8, hatch=hatch)
                ticks.append(x)
                labels.append(k)
                x += 1
            x += 0.7
            del title
        ax.set_xticks(ticks, labels, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("samples/s (global)")
        ax.set_title(f"{m.upper()}: training throughput")
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
