"""Lightning on popdist_torch: IPUStrategy against Lightning's DDP and against a raw executor loop.

Two comparisons, each run side by side in interleaved rounds (every case is a fresh
launch; the ratio is taken per round, its median reported):

* training throughput, 2 instances: ``IPUStrategy`` under ``poprun --num-instances 2``
  (1 local replica each, ``device_iterations`` 8) against Lightning's own DDP strategy
  (``Trainer(accelerator="cpu", devices=2, strategy="ddp")``, gloo, the two processes
  Lightning starts), the same LightningModule and the same global batch per update;
  the goal: ≥ 1.2×. DDP runs as users run it (torch's default threads) and, as a second
  anchor, with one intra-op thread per process, as poprun's instances get on 2 cores.
* per-step cost, one process: a Lightning step of ``IPUStrategy`` (one executor call,
  ``device_iterations`` updates, ``self.log`` included) against the same call in a raw
  ``popdist_torch`` loop on the same module, one intra-op thread; the goal: ≤ 1.5×. Both
  run in one launch, in alternating blocks (a ``Trainer.fit``, then a pass of the raw loop,
  then the other way round), and a round's ratio is the median of its block pairs' ratios:
  separate launches drifted by more than the cost being measured (issue 33).

Writes docs/lightning-benchmark.md and .json.

    .venv/bin/python benchmarks/lightning_strategy.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FEATURES, HIDDEN, CLASSES = 64, 512, 10
MICRO = 32  # per replica (IPUStrategy) and per process (DDP)
DEVICE_ITERATIONS = 8
#: Lightning's progress bar, logger, summary and checkpoints off, one epoch, for every case.
QUIET: dict[str, Any] = {
    "logger": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "enable_checkpointing": False,
    "max_epochs": 1,
}
#: Pairs of (Lightning fit, raw loop) blocks in the one-process launch of the per-step goal.
BLOCKS = 6
PER_CALL = MICRO * DEVICE_ITERATIONS  # samples per executor call in one process
STEP_AB = "per-step A/B, 1 process"


# -- worker side (runs inside one launched process) ----------------------------------------
def _module(lr: float = 0.01) -> Any:
    import lightning.pytorch as pl
    import torch
    from torch.nn import functional as F
    from torch.utils.data import DataLoader, TensorDataset

    class MLP(pl.LightningModule):
        """Two hidden layers of 512 on generated 64-feature samples; logs its loss."""

        def __init__(self, samples: int) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                torch.nn.Linear(HIDDEN, CLASSES),
            )  # fmt: skip
            g = torch.Generator().manual_seed(1)
            self.data = TensorDataset(
                torch.randn(samples, FEATURES, generator=g),
                torch.randint(0, CLASSES, (samples,), generator=g),
            )

        def forward(self, x: Any) -> Any:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = F.cross_entropy(self(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=lr)

        def train_dataloader(self) -> Any:
            return DataLoader(self.data, batch_size=MICRO)

    return MLP


def _timer(warmup: int, out: Path | None, samples_per_step: int) -> Any:
    import lightning.pytorch as pl

    class Timer(pl.Callback):
        """Times the Lightning steps after ``warmup``; rank 0 writes samples/s and s/step."""

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, i: int) -> None:
            if i == warmup:
                self.t0 = time.perf_counter()
                self.first = i

        def on_train_end(self, trainer: Any, module: Any) -> None:
            elapsed = time.perf_counter() - self.t0
            steps = trainer.fit_loop.epoch_loop.batch_progress.current.completed - self.first
            self.figure = {
                "samples_per_s": steps * samples_per_step / elapsed,
                "s_per_step": elapsed / steps,
            }
            if trainer.is_global_zero and out is not None:
                out.write_text(json.dumps(self.figure))

    return Timer()


class RawLoop:
    """The same module's step as a raw ``popdist_torch`` loop: one executor, made once."""

    def __init__(self, mlp: Any, steps: int, warmup: int) -> None:
        import torch
        from torch.nn import functional as F

        import popdist
        import popdist_torch as poptorch

        self.per_call = MICRO * DEVICE_ITERATIONS * popdist.getNumInstances()
        self.warmup = warmup
        module = mlp(self.per_call * (steps + warmup))

        class WithLoss(torch.nn.Module):
            def __init__(self, net: torch.nn.Module) -> None:
                super().__init__()
                self.net = net

            def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
                out = self.net(x)
                return out, F.cross_entropy(out, y)

        opts = poptorch.Options().deviceIterations(DEVICE_ITERATIONS)
        model = WithLoss(module.net)
        self.training = poptorch.trainingModel(
            model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.01)
        )
        self.loader = poptorch.DataLoader(opts, module.data, batch_size=MICRO)

    def run(self) -> dict[str, float]:
        """One pass over the loader; samples/s and s/step after the warm-up."""
        t0, done = 0.0, 0
        for i, (x, y) in enumerate(self.loader):
            if i == self.warmup:
                t0 = time.perf_counter()
            self.training(x, y)
            done = i + 1
        elapsed = time.perf_counter() - t0
        n = done - self.warmup
        return {"samples_per_s": n * self.per_call / elapsed, "s_per_step": elapsed / n}


def _lightning_block(mlp: Any, steps: int, warmup: int) -> dict[str, float]:
    """One ``Trainer.fit`` of ``IPUStrategy`` in this process: its steps after the warm-up."""
    import lightning.pytorch as pl

    from popdist_lightning import IPUStrategy

    timer = _timer(warmup, None, PER_CALL)
    trainer = pl.Trainer(
        accelerator="ipu",
        devices=1,
        strategy=IPUStrategy(device_iterations=DEVICE_ITERATIONS),
        callbacks=[timer],
        **QUIET,
    )
    trainer.fit(mlp(PER_CALL * (steps + warmup)))
    figure: dict[str, float] = timer.figure
    return figure


def _step_blocks(mlp: Any, steps: int, warmup: int, blocks: int) -> dict[str, list[float]]:
    """The per-step comparison in one process (issue 33): ``blocks`` pairs of a Lightning
    fit and a raw loop of the same steps, next to each other, the order alternating, so a
    pair's ratio sees one state of the machine (launch-to-launch drift was most of the
    spread when each case was its own launch)."""
    raw = RawLoop(mlp, steps, warmup)
    got: dict[str, list[float]] = {"lightning": [], "raw": []}
    for b in range(blocks):
        for kind in ("lightning", "raw") if b % 2 == 0 else ("raw", "lightning"):
            block = _lightning_block(mlp, steps, warmup) if kind == "lightning" else raw.run()
            got[kind].append(block["s_per_step"])
    return got


def worker(kind: str, steps: int, warmup: int, out: Path) -> None:
    """One case: ``ipu`` (under poprun), ``ddp`` (Lightning spawns), ``raw`` (under poprun)
    or ``step-ab`` (one process: Lightning steps and raw calls in alternating blocks)."""
    import warnings

    import lightning.pytorch as pl

    warnings.filterwarnings("ignore")
    mlp = _module()
    if kind == "ipu":
        import popdist
        from popdist_lightning import IPUStrategy

        instances = popdist.getNumInstances()
        per_call = MICRO * DEVICE_ITERATIONS * instances
        model = mlp(per_call * (steps + warmup))
        trainer = pl.Trainer(
            accelerator="ipu",
            devices=1,
            strategy=IPUStrategy(device_iterations=DEVICE_ITERATIONS),
            callbacks=[_timer(warmup, out, per_call)],
            **QUIET,
        )
        trainer.fit(model)
    elif kind == "ddp":
        per_step = MICRO * 2
        model = mlp(per_step * (steps + warmup))
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=2,
            strategy="ddp",
            callbacks=[_timer(warmup, out, per_step)],
            **QUIET,
        )
        trainer.fit(model)
    elif kind == "raw":
        import popdist

        loop = RawLoop(mlp, steps, warmup)
        figure = loop.run()
        if popdist.getInstanceIndex() == 0:
            out.write_text(json.dumps(figure))
    elif kind == "step-ab":
        out.write_text(json.dumps(_step_blocks(mlp, steps, warmup, BLOCKS)))
    else:
        raise SystemExit(f"unknown worker kind {kind!r}")


# -- driver side ------------------------------------------------------------------------------
def _env(threads: int | None = None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("POPDIST_", "OMPI_", "PMIX_", "HOROVOD_"))
    }
    env["PYTHONPATH"] = str(ROOT)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def launch(kind: str, steps: int, warmup: int, threads: int | None = None) -> dict[str, float]:
    """Run one case as a fresh launch; its rank 0's measurement."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        me = [sys.executable, str(Path(__file__).resolve()), "--worker", kind]
        me += ["--steps", str(steps), "--warmup", str(warmup), "--out", str(out)]
        if kind in ("ipu", "raw-2"):
            me[me.index(kind)] = kind.removesuffix("-2")
            argv = [sys.executable, "-m", "poprun", "--num-instances", "2", "--num-replicas", "2"]
            argv += me
        else:
            argv = me
        done = subprocess.run(
            argv, cwd=ROOT, env=_env(threads), capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"{kind} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="timed executor calls per run")
    parser.add_argument(
        "--one-process-steps",
        type=int,
        default=50,
        help=f"timed calls per block of the per-step comparison ({BLOCKS} pairs per launch)",
    )
    parser.add_argument("--max-rounds", type=int, default=10, help="more rounds until margin")
    parser.add_argument("--budget", type=float, default=700, help="seconds for all rounds")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-doc", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.steps, args.warmup, args.out)
        return 0

    from benchmarks._common import Summary, rounds_until_clear, save_results, table, write_doc
    from benchmarks.goals import clears

    ddp_steps = args.steps * DEVICE_ITERATIONS  # the same number of weight updates
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    cases = {
        "IPUStrategy, poprun 2 instances": lambda: launch("ipu", args.steps, args.warmup),
        "DDP (gloo), 2 processes": lambda: launch("ddp", ddp_steps, args.warmup * 4),
        "DDP (gloo), 2 processes, 1 thread each": lambda: launch(
            "ddp", ddp_steps, args.warmup * 4, threads=1
        ),
        # One intra-op thread for both: the comparison is the per-call overhead, not how
        # two OpenMP threads fare on a loaded machine.
        "raw popdist_torch loop, poprun 2 instances": lambda: launch(
            "raw-2", args.steps, args.warmup
        ),
        # The per-step goal: one launch, Lightning steps and raw calls in alternating blocks.
        STEP_AB: lambda: launch("step-ab", args.one_process_steps, args.warmup, threads=1),
    }
    ipu_1, raw_1 = "IPUStrategy, 1 process", "raw popdist_torch loop, 1 process"
    names = [n for n in cases if n != STEP_AB] + [ipu_1, raw_1]
    got: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    per_step: list[float] = []  # a round's median of its block-pair ratios

    def one_round(r: int) -> None:
        order = list(cases)[r % len(cases) :] + list(cases)[: r % len(cases)]
        for name in order:
            if name == STEP_AB:
                blocks = cases[name]()
                pairs = zip(blocks["lightning"], blocks["raw"], strict=True)
                per_step.append(statistics.median(a / b for a, b in pairs))
                for side, key in ((ipu_1, "lightning"), (raw_1, "raw")):
                    t = statistics.median(blocks[key])
                    got[side].append({"s_per_step": t, "samples_per_s": PER_CALL / t})
                print(f"round {r}: {name}: {blocks} -> {per_step[-1]:.3f}", flush=True)
                continue
            got[name].append(cases[name]())
            print(f"round {r}: {name}: {got[name][-1]}", flush=True)

    def series(name: str, key: str) -> list[float]:
        return [m[key] for m in got[name]]

    def ratios(a: str, b: str, key: str = "samples_per_s") -> list[float]:
        """Round by round, case ``a`` over case ``b``."""
        return [x / y for x, y in zip(series(a, key), series(b, key), strict=True)]

    ipu_2 = "IPUStrategy, poprun 2 instances"

    def settled() -> bool:  # both goals clear with margin (issue 33)
        return clears(ratios(ipu_2, "DDP (gloo), 2 processes"), 1.2, "≥") and clears(
            per_step, 1.5, "≤"
        )

    rounds = rounds_until_clear(
        one_round, args.rounds, settled=settled, max_rounds=args.max_rounds, budget_s=args.budget
    )

    vs_ddp = ratios(ipu_2, "DDP (gloo), 2 processes")
    vs_ddp1 = ratios(ipu_2, "DDP (gloo), 2 processes, 1 thread each")
    vs_raw2 = ratios(ipu_2, "raw popdist_torch loop, poprun 2 instances")
    result = {
        "rounds": rounds,
        "samples_per_s": {n: series(n, "samples_per_s") for n in names},
        "s_per_step": {n: series(n, "s_per_step") for n in names},
        "ratio": {
            "ipu_2_vs_ddp_2": statistics.median(vs_ddp),
            "ipu_2_vs_ddp_2_one_thread": statistics.median(vs_ddp1),
            "lightning_step_vs_raw_step": statistics.median(per_step),
            "ipu_2_vs_raw_2": statistics.median(vs_raw2),
        },
        "ratios_per_round": {
            "ipu_2_vs_ddp_2": vs_ddp,
            "ipu_2_vs_ddp_2_one_thread": vs_ddp1,
            "lightning_step_vs_raw_step": per_step,
            "ipu_2_vs_raw_2": vs_raw2,
        },
    }
    rows = [
        [n, Summary(tuple(series(n, "samples_per_s"))).fmt(unit="samples/s", digits=0),
         Summary(tuple(series(n, "s_per_step"))).fmt(scale=1e3, unit="ms", digits=2)]
        for n in names
    ]  # fmt: skip
    fmt = ", ".join
    r = result["ratio"]
    goal_rows = [
        ["IPUStrategy 2 instances / Lightning DDP 2 processes ≥ 1.2×",
         f"{r['ipu_2_vs_ddp_2']:.2f}", fmt(f"{x:.2f}" for x in vs_ddp),
         "yes" if clears(vs_ddp, 1.2, "≥") else "no"],
        ["(anchor: DDP with 1 intra-op thread per process)",
         f"{r['ipu_2_vs_ddp_2_one_thread']:.2f}", fmt(f"{x:.2f}" for x in vs_ddp1), "—"],
        ["(anchor: the raw popdist_torch loop under poprun, 2 instances)",
         f"{r['ipu_2_vs_raw_2']:.2f}", fmt(f"{x:.2f}" for x in vs_raw2), "—"],
        ["IPUStrategy step / raw popdist_torch call ≤ 1.5×",
         f"{r['lightning_step_vs_raw_step']:.2f}", fmt(f"{x:.2f}" for x in per_step),
         "yes" if clears(per_step, 1.5, "≤") else "no"],
    ]  # fmt: skip
    body = (
        f"MLP {FEATURES}→{HIDDEN}→{HIDDEN}→{CLASSES} on generated data, SGD, `self.log` of the "
        f"loss every step; micro-batch {MICRO}; IPUStrategy with `device_iterations` "
        f"{DEVICE_ITERATIONS} (one Lightning step = {DEVICE_ITERATIONS} weight updates); DDP "
        f"with batch {MICRO} per process (the same global batch, {2 * MICRO}, per update). "
        f"{args.steps} timed IPUStrategy steps ({args.steps * DEVICE_ITERATIONS} for DDP; "
        f"{args.one_process_steps} per block of the one-process comparison) after a warm-up; "
        f"each case a fresh launch, except the one-process comparison: one launch a round, "
        f"{BLOCKS} pairs of blocks (a Lightning fit, a pass of the raw loop, the order "
        f"alternating), the round's ratio the median of its pairs'; {rounds} interleaved rounds "
        f"(at least {args.rounds}, more up to {args.max_rounds} until both goals clear with "
        f"margin). Progress bar, logger and checkpoints off for all; the one-process comparison "
        f"with one intra-op thread. "
        f"Load average before the run: {load}.\n\n"
        + table(["case", "throughput", "time per Lightning step"], rows)
        + "\n\n"
        + table(["goal", "median ratio", "per round", "met with margin?"], goal_rows)
    )
    print(body)
    if not args.no_doc:
        write_doc(
            "lightning-benchmark.md", "Lightning: IPUStrategy against DDP and a raw loop", body
        )
        save_results("lightning-benchmark", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
