"""``make gpu-check``: the GPU path in one command, with its figures.

On a machine with a CUDA GPU it runs, each launched by poprun:

1. NCCL with 1 rank: ``poprun --backend torch`` starts torch.distributed with NCCL, a CUDA
   tensor is all-reduced, the executor's gradient path times 16-256 MB gradients;
2. 1 instance x N local replicas on the GPU: model, batch and optimizer state on the GPU,
   the replicas as one ``vmap``, weights changing, outputs back in host memory;
3. the benchmark: samples/s of that run against plain torch on the N x batch on the same
   GPU (interleaved rounds, median of the per-round ratios; goal ≥ 0.9).

and prints the figures as a Markdown table (for docs/performance.md). Without a GPU it
says so and exits 2; ``--cpu`` runs the same steps on the CPU (gloo instead of NCCL) so
the plumbing can be checked anywhere.

    .venv/bin/python scripts/gpu_check.py [--replicas 4] [--rounds 5] [--cpu] [--quick]
        [--sizes 2048x256,4096x1024] [--save]

``--sizes`` compares several MLPs (hidden width x micro-batch): a small step shows the
executor's fixed cost a step, a large one how close it comes when the GPU's work dominates.
``--save`` keeps the figures as this GPU's record in docs/gpu-check.{json,md}, which
docs/performance.md reports (``benchmarks/run_all.py --assemble-only``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SIZES_MB = (16, 64, 256)


def _model(width: int) -> Any:
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(784, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                nn.Linear(width, 10),
            )  # fmt: skip

        def forward(self, x: Any, y: Any) -> Any:
            out = self.net(x)
            return out, nn.functional.cross_entropy(out, y)

    return Mlp()


def _rate(step: Any, samples: int, warmup: int, iters: int, sync: Any) -> float:
    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    return samples * iters / (time.perf_counter() - t0)


def worker(kind: str, args: argparse.Namespace) -> None:
    """One process; prints ``RESULT {json}``."""
    import torch

    torch.manual_seed(0)
    cuda = torch.cuda.is_available() and not args.cpu
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    result: dict[str, Any] = {"kind": kind}
    if kind == "nccl":
        import popdist
        from popdist_torch.execution.reducer import GradientReducer

        popdist.init()
        backend = popdist.collectives.started()  # the torch backend, even for 1 rank
        group = getattr(backend, "process_group_backend", None)
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        t = torch.full((4,), 2.0, device=device)
        backend.allreduce_(t)
        result.update(backend=backend.name, group=group, allreduce=t.tolist(), device=str(device))
        bandwidth = {}
        for mb in SIZES_MB[: 1 if args.quick else None]:
            param = torch.nn.Parameter(torch.ones(mb << 18, device=device))
            param.grad = torch.ones_like(param)
            reducer = GradientReducer(backend, [("w", param)], average=False)
            seconds = 1.0 / _rate(reducer.reduce_all, 1, 2, 3 if args.quick else 20, sync)
            bandwidth[mb] = (mb << 20) / seconds / 1e9
        result["algbw_gbps"] = bandwidth
    else:
        model = _model(args.width)
        micro = args.micro
        if kind == "plain":
            device = torch.device("cuda") if cuda else torch.device("cpu")
            model.to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            batch = micro * args.replicas
            x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))

            def step() -> None:
                opt.zero_grad()
                model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))[
                    1
                ].backward()
                opt.step()

        else:
            import popdist.poptorch
            import popdist_torch as poptorch

            opts = popdist.poptorch.Options()
            batch = micro * opts.replication_factor
            x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
            wrapped = poptorch.trainingModel(
                model, opts, torch.optim.SGD(model.parameters(), lr=0.01)
            )
            first = model.net[0].weight.detach().clone()
            out, _ = wrapped(x, y)
            result.update(
                replicas=opts.replication_factor,
                param_device=str(model.net[0].weight.device),
                output_device=str(out.device),
                weights_changed=not torch.equal(model.net[0].weight.detach().cpu(), first.cpu()),
            )

            def step() -> None:
                wrapped(x, y)

        iters = 3 if args.quick else args.iters
        result["samples_per_s"] = _rate(step, batch, 2 if args.quick else 10, iters, sync)
    print("RESULT " + json.dumps(result), flush=True)


def job_free_env(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without the marks of a job it may run inside (``POPDIST_*``, Open MPI's and
    PMIx's per-job variables), keeping the user's MCA settings (``OMPI_MCA_*``, ``PMIX_MCA_*``):
    a GPU box without ssh sets ``OMPI_MCA_plm=isolated``, and mpirun needs it there."""
    return {
        k: v
        for k, v in environ.items()
        if not k.startswith(("POPDIST_", "OMPI_", "PMIX_"))
        or k.startswith(("OMPI_MCA_", "PMIX_MCA_"))
    }


def _launch(argv: list[str]) -> dict[str, Any]:
    env = job_free_env(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if "RESULT " in line]
    if proc.returncode or not lines:
        raise SystemExit(
            f"gpu-check: {' '.join(argv)} failed ({proc.returncode}):\n"
            f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(lines[0].split("RESULT ", 1)[1])
    return result


def _poprun(replicas: int, *tail: str, backend: str = "torch") -> list[str]:
    poprun = [sys.executable, "-m", "poprun", "--num-instances", "1"]
    return [*poprun, "--num-replicas", str(replicas), "--backend", backend, *tail]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=4, help="local replicas N")
    parser.add_argument("--micro", type=int, default=256, help="micro-batch per replica")
    parser.add_argument("--width", type=int, default=2048, help="hidden width of the MLP")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--cpu", action="store_true", help="run the steps on the CPU")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny timings")
    parser.add_argument(
        "--sizes",
        default="",
        help="WIDTHxMICRO,... the MLPs to compare (default: --width x --micro)",
    )
    parser.add_argument(
        "--save", action="store_true", help="write docs/gpu-check.{json,md} (this GPU's record)"
    )
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args)
        return 0
    sizes = [(args.width, args.micro)]
    if args.sizes:
        try:
            sizes = [_size(text) for text in args.sizes.split(",")]
        except ValueError:
            parser.error(f"--sizes {args.sizes!r}: give WIDTHxMICRO,... such as 2048x256,4096x1024")
    if args.save and (args.cpu or args.quick):
        print(
            "gpu-check: --save keeps a GPU's full figures: drop --cpu and --quick", file=sys.stderr
        )
        return 2
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA GPU is visible here (torch.cuda.is_available() is False): "
            "run it on a machine with a GPU, or pass --cpu to check the plumbing on the CPU",
            file=sys.stderr,
        )
        return 2
    name = "CPU (--cpu)" if args.cpu else torch.cuda.get_device_name(0)
    print(f"gpu-check on {name}, torch {torch.__version__}")
    nccl = _launch(_poprun(1, *_me(args, *sizes[0]), "--worker", "nccl"))
    expect = "gloo" if args.cpu else "cpu:gloo,cuda:nccl"
    assert nccl["group"] == expect, nccl
    assert nccl["allreduce"] == [2.0] * 4, nccl
    print(f"1. {nccl['backend']} backend, process group {nccl['group']} on {nccl['device']}: ok")
    measured = {f"{w}x{m}": _replicas_vs_plain(args, w, m) for w, m in sizes}
    print(f"2. 1 instance x {args.replicas} local replicas on the device: ok")
    body = _table(name, nccl, sizes, measured, args.replicas)
    print(f"3. figures:\n\n{body}")
    if args.save:
        _save(args, name, nccl, measured, body)
    return 0


def _table(
    name: str,
    nccl: dict[str, Any],
    sizes: list[tuple[int, int]],
    measured: dict[str, dict[str, Any]],
    replicas: int,
) -> str:
    """The figures as a Markdown table (for docs/gpu-check.md and docs/performance.md)."""
    rows = [
        ("device", name),
        (f"gradient path ({nccl['group']}), 1 rank, algbw GB/s", ", ".join(
            f"{mb} MB {v:.1f}" for mb, v in nccl["algbw_gbps"].items())),
    ]  # fmt: skip
    for (w, m), got in zip(sizes, measured.values(), strict=True):
        rows += [
            (f"MLP width {w}: 1 x {replicas} local replicas x {m}, samples/s (median)",
             f"{statistics.median(got['executor']):.0f}"),
            (f"MLP width {w}: plain torch, batch {replicas * m}, samples/s (median)",
             f"{statistics.median(got['plain']):.0f}"),
            (f"MLP width {w}, micro-batch {m}: local replicas / plain torch (goal ≥ 0.9)",
             f"**{statistics.median(got['ratios']):.3f}** (rounds: "
             + ", ".join(f"{r:.2f}" for r in got["ratios"]) + ")"),
        ]  # fmt: skip
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {f} | {v} |" for f, v in rows)


def _size(text: str) -> tuple[int, int]:
    """``WIDTHxMICRO`` (``--sizes``); ``ValueError`` for anything else."""
    width, _, micro = text.strip().partition("x")
    size = int(width), int(micro)
    if min(size) < 1:
        raise ValueError(text)
    return size


def _me(args: argparse.Namespace, width: int, micro: int) -> list[str]:
    """This script as one launch's worker of the MLP of ``width`` on micro-batches of ``micro``."""
    me = [sys.executable, str(Path(__file__).resolve())]
    me += ["--micro", str(micro), "--width", str(width)]
    me += ["--iters", str(args.iters), "--replicas", str(args.replicas)]
    return me + ["--cpu"] * args.cpu + ["--quick"] * args.quick


def _replicas_vs_plain(args: argparse.Namespace, width: int, micro: int) -> dict[str, Any]:
    """Interleaved rounds of the executor's local replicas and plain torch on the N x batch:
    each side's samples/s a round and the per-round ratios."""
    rates: dict[str, Any] = {"executor": [], "plain": []}
    me = _me(args, width, micro)
    for r in range(1 if args.quick else args.rounds):
        for kind in ("executor", "plain") if r % 2 == 0 else ("plain", "executor"):
            if kind == "executor":
                got = _launch(_poprun(args.replicas, *me, "--worker", "executor"))
                on = "cpu" if args.cpu else "cuda"
                assert got["param_device"].startswith(on) and got["output_device"] == "cpu", got
                assert got["weights_changed"] and got["replicas"] == args.replicas, got
            else:
                got = _launch(_poprun(1, *me, "--worker", "plain"))
            rates[kind].append(got["samples_per_s"])
    rates["ratios"] = [e / p for e, p in zip(rates["executor"], rates["plain"], strict=True)]
    return rates


def _save(
    args: argparse.Namespace,
    device: str,
    nccl: dict[str, Any],
    measured: dict[str, dict[str, Any]],
    body: str,
) -> None:
    """docs/gpu-check.{json,md}: the record of this GPU (the goal reads the first size's
    per-round ratios), kept beside other GPUs' and CPUs' records (``benchmarks/_common``)."""
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks._common import cpu_model, save_results, write_doc

    first = next(iter(measured.values()))
    record = {
        "device": device,
        "torch": torch.__version__,
        "replicas": args.replicas,
        "ratio": statistics.median(first["ratios"]),
        "ratios_per_round": first["ratios"],
        "sizes": measured,
        "algbw_gbps": nccl["algbw_gbps"],
    }
    save_results("gpu-check", record, cpu=f"{device} (host: {cpu_model()})")
    write_doc("gpu-check.md", "The GPU path (make gpu-check)", f"On {device}.\n\n{body}")


if __name__ == "__main__":
    sys.exit(main())
