"""``make gpu-check``: the GPU path in one command, with its figures (at most about 6 minutes).

On a machine with a CUDA GPU it runs, each launched by poprun:

1. NCCL with 1 rank: ``poprun --backend torch`` starts torch.distributed with NCCL, a CUDA
   tensor is all-reduced, the executor's gradient path times 16-256 MB gradients;
2. the benchmark: samples/s of 1 instance x N local replicas (the fused micro-step captured
   in a CUDA graph, model, batch and optimizer state on the GPU, outputs back in host
   memory) against plain torch on the N x batch on the same GPU, for each MLP of
   ``--sizes`` (interleaved rounds, median of the per-round ratios; goal ≥ 0.9), then one
   round with graphs off, the control;
3. the captured micro-step (1 instance x N local replicas): captured once, then replayed;
   20 weight updates with graphs on and off end on the same weights (bitwise, else the
   largest relative difference; goal rtol 1e-6); the host synchronisations of a training
   call are counted (goal: one, the outputs' copy to host); whether replayed dropout masks
   equal eager ones is reported (it decides whether models that draw random numbers may be
   captured later);
4. the pipelined example's model (examples/mnist_pipeline.py, two stages) trained on the GPU,
   against its stages on CPU workers (``--offline-mode``; goal: the GPU faster) and against
   the same model unpipelined in plain torch on the GPU (same weights within rtol 1e-5).

It prints the figures as a Markdown table (for docs/performance.md). Without a GPU it says
so and exits 2; ``--cpu`` runs the same steps on the CPU (gloo instead of NCCL, the capture
seam's CPU stand-in instead of CUDA graphs) so the plumbing can be checked anywhere.

    .venv/bin/python scripts/gpu_check.py [--replicas 4] [--rounds 5] [--cpu] [--quick]
        [--sizes 2048x256,4096x1024 | --width 2048 --micro 256] [--save]

``--sizes`` compares several MLPs (hidden width x micro-batch): a small step shows the
executor's fixed cost a step, a large one how close it comes when the GPU's work dominates.
``--save`` keeps the figures as this GPU's record in docs/gpu-check.{json,md}, which
docs/performance.md reports (``benchmarks/run_all.py --assemble-only``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SIZES_MB = (16, 64, 256)
UPDATES = 20  # weight updates of the graphs on / off comparison
PIPELINE_MICRO, PIPELINE_ACCUMULATION = 64, 8


#: What the record's rows mean, kept under the table of docs/gpu-check.md.
EXPLAINED = """What the rows are: the gradient path is NCCL with one rank; "captured, replayed" counts
the executor's CUDA graphs of the fused training micro-step (docs/executor.md, the captured
micro-step); "graphs on vs off" compares the weights after 20 updates of the same model, data
and initialisation with `Options.Training.cudaGraphs` on and off; "host syncs" counts CUDA's
sync debug mode's warnings in one training call (the outputs' one copy to host is the one
expected) and the tensors the host read on the device; the MLP rows are 1 instance x N local
replicas against plain torch on the N x batch, interleaved rounds, the ratio the median of the
per-round ratios, with one round with graphs off as the control; the pipelined rows train
examples/mnist_pipeline.py's two stages (`--ipus-per-replica 2`) on the GPU, on CPU workers
(`--offline-mode`) and unpipelined in plain torch on the GPU."""


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


def _use_cpu_graphs(args: argparse.Namespace) -> None:
    """``--cpu``: the capture seam's CPU stand-in, so the graphed path's plumbing runs."""
    if args.cpu:
        from popdist_torch.execution.capture import seam

        seam.BACKENDS["cpu"] = seam.RerunGraphs


def _graphs_of(wrapped: Any) -> dict[str, Any]:
    """What the graphed step of a wrapped model did: captures, replays, or why it is off."""
    graphs = getattr(wrapped.replica_runner, "graphs", None)
    if graphs is None:
        return {"captures": 0, "replays": 0}
    return {"captures": graphs.backend.captures, "replays": graphs.backend.replays}


def nccl_worker(args: argparse.Namespace, cuda: bool, sync: Any) -> dict[str, Any]:
    import torch

    import popdist
    from popdist_torch.execution.reducer import GradientReducer

    popdist.init()
    backend = popdist.collectives.started()  # the torch backend, even for 1 rank
    group = getattr(backend, "process_group_backend", None)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    t = torch.full((4,), 2.0, device=device)
    backend.allreduce_(t)
    result = {
        "backend": backend.name,
        "group": group,
        "allreduce": t.tolist(),
        "device": str(device),
    }
    bandwidth = {}
    for mb in SIZES_MB[: 1 if args.quick else None]:
        param = torch.nn.Parameter(torch.ones(mb << 18, device=device))
        param.grad = torch.ones_like(param)
        reducer = GradientReducer(backend, [("w", param)], average=False)
        seconds = 1.0 / _rate(reducer.reduce_all, 1, 2, 3 if args.quick else 20, sync)
        bandwidth[mb] = (mb << 20) / seconds / 1e9
    result["algbw_gbps"] = bandwidth
    return result


def speed_worker(kind: str, args: argparse.Namespace, cuda: bool, sync: Any) -> dict[str, Any]:
    import torch

    model = _model(args.width)
    micro = args.micro
    result: dict[str, Any] = {}
    if kind == "plain":
        device = torch.device("cuda") if cuda else torch.device("cpu")
        model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        batch = micro * args.replicas
        x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))

        def step() -> None:
            opt.zero_grad()
            model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))[1].backward()
            opt.step()

    else:
        import popdist.poptorch
        import popdist_torch as poptorch

        _use_cpu_graphs(args)
        opts = popdist.poptorch.Options()
        opts.Training.cudaGraphs(args.graphs == "on")
        batch = micro * opts.replication_factor
        x, y = torch.randn(batch, 784), torch.randint(0, 10, (batch,))
        wrapped = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
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
    if kind == "executor":
        result.update(_graphs_of(wrapped))
    return result


def _trained(graphs: bool, args: argparse.Namespace, device: Any) -> tuple[list[Any], Any]:
    """The weights after :data:`UPDATES` updates (2 device iterations x 2 accumulation steps
    a call), graphs on or off, from one initialisation and one data order."""
    import torch

    import popdist.poptorch
    import popdist_torch as poptorch

    torch.manual_seed(0)
    model = _model(args.width)
    opts = popdist.poptorch.Options().deviceIterations(2)
    opts.Training.gradientAccumulation(2)
    opts.Training.cudaGraphs(graphs)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    wrapped = poptorch.trainingModel(model, opts, opt)
    n = 4 * opts.replication_factor * args.micro
    gen = torch.Generator().manual_seed(1)
    for _ in range(UPDATES // 2):
        wrapped(torch.randn(n, 784, generator=gen), torch.randint(0, 10, (n,), generator=gen))
    return [p.detach().cpu() for p in model.parameters()], wrapped


def _syncs(wrapped: Any, n: int, cuda: bool) -> dict[str, int]:
    """Host synchronisations of one training call: CUDA's sync debug mode's warnings (every
    synchronising CUDA call) and the tensors the host read (``_local_scalar_dense``) on a
    device, the optimizer's step counters (host tensors) left out."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), k: Any = None) -> Any:
            if func is torch.ops.aten._local_scalar_dense.default and a[0].device.type != "cpu":
                Reads.count += 1
            return func(*a, **(k or {}))

    x, y = torch.randn(n, 784), torch.randint(0, 10, (n,))
    wrapped(x, y)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen, Reads():
            warnings.simplefilter("always")
            wrapped(x, y)
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(0)
    debug = [w for w in seen if "synchroniz" in str(w.message).lower()]
    return {"sync_debug_warnings": len(debug), "device_reads": Reads.count}


def _masks_equal(device: Any) -> bool | None:
    """Whether a captured, replayed vmapped dropout draws the eager masks (None on the CPU)."""
    import torch
    from torch.func import vmap

    if device.type != "cuda":
        return None
    x = torch.ones(4, 8, 1024, device=device)

    def drop() -> Any:
        return vmap(lambda t: torch.nn.functional.dropout(t, 0.5), randomness="different")(x)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        drop()  # warm-up, then the seeded runs
    torch.cuda.current_stream().wait_stream(stream)
    torch.manual_seed(0)
    eager = [drop().clone() for _ in range(3)]
    torch.manual_seed(0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = drop()
    replayed = []
    for _ in range(3):
        graph.replay()
        replayed.append(out.clone())
    return all(torch.equal(a, b) for a, b in zip(eager, replayed, strict=True))


def capture_worker(args: argparse.Namespace, cuda: bool) -> dict[str, Any]:
    """Step 2: the capture smoke test, graphs on against off, the sync count, the masks."""
    import torch

    _use_cpu_graphs(args)
    device = torch.device("cuda") if cuda else torch.device("cpu")
    off, _ = _trained(False, args, device)
    on, wrapped = _trained(True, args, device)
    graphed = _graphs_of(wrapped)
    rel = max(
        float(((a - b).abs() / b.abs().clamp_min(1e-30)).max())
        for a, b in zip(on, off, strict=True)
    )
    result: dict[str, Any] = {
        **graphed,
        "param_device": str(next(wrapped.model.parameters()).device),
        "bitwise_equal": all(torch.equal(a, b) for a, b in zip(on, off, strict=True)),
        "max_rel_diff": rel,
        "masks_equal": _masks_equal(device),
    }
    n = 4 * wrapped.options.replication_factor * args.micro
    result["syncs_graphs_on"] = _syncs(wrapped, n, cuda)
    _, eager = _trained(False, args, device)
    result["syncs_graphs_off"] = _syncs(eager, n, cuda)
    return result


def _pipeline_example() -> Any:
    spec = importlib.util.spec_from_file_location(
        "mnist_pipeline", ROOT / "examples" / "mnist_pipeline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pipeline_worker(kind: str, args: argparse.Namespace, cuda: bool, sync: Any) -> dict[str, Any]:
    """Step 4: the example's two-stage model trained pipelined (on the GPU, or its stages on
    CPU workers under --offline-mode), or the same model unpipelined in plain torch."""
    import torch

    import popdist.poptorch
    import popdist_torch as poptorch

    example = _pipeline_example()
    torch.manual_seed(0)
    net = example.Network()
    model = example.TrainingModelWithLoss(net)
    micro, ga = (8, 2) if args.quick else (PIPELINE_MICRO, PIPELINE_ACCUMULATION)
    n = micro * ga
    gen = torch.Generator().manual_seed(1)
    x, y = torch.rand(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)
    result: dict[str, Any] = {}
    if kind == "plain":
        device = torch.device("cuda") if cuda else torch.device("cpu")
        model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step() -> None:
            opt.zero_grad()
            for xs, ys in zip(x.chunk(ga), y.chunk(ga), strict=True):
                (model(xs.to(device), ys.to(device))[1] / ga).backward()
            opt.step()

    else:
        opts = popdist.poptorch.Options()
        opts.Training.gradientAccumulation(ga)
        opts.setExecutionStrategy(example.strategy("pipelined"))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        wrapped = poptorch.trainingModel(model, opts, opt)

        def step() -> None:
            out, _ = wrapped(x, y)
            result["output_device"] = str(out.device)

    for _ in range(2):  # then the weights, against plain torch's after the same two steps
        step()
    result["stage_devices"] = sorted({str(p.device) for p in model.parameters()})
    result["weights_after_2"] = [
        p.detach().cpu().flatten()[:64].tolist() for p in model.parameters()
    ]
    iters = 3 if args.quick else max(10, args.iters // 2)
    result["samples_per_s"] = _rate(step, n, 2 if args.quick else 5, iters, sync)
    return result


def worker(kind: str, args: argparse.Namespace) -> None:
    """One process; prints ``RESULT {json}``."""
    import torch

    torch.manual_seed(0)
    cuda = torch.cuda.is_available() and not args.cpu
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if kind == "nccl":
        result = nccl_worker(args, cuda, sync)
    elif kind == "capture":
        result = capture_worker(args, cuda)
    elif kind.startswith("pipeline-"):
        result = pipeline_worker(kind.removeprefix("pipeline-"), args, cuda, sync)
    else:
        result = speed_worker(kind, args, cuda, sync)
    print("RESULT " + json.dumps({"kind": kind, **result}), flush=True)


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
    result["stderr_notes"] = [
        line for line in proc.stderr.splitlines() if "popdist_torch:" in line
    ][:5]
    return result


def _poprun(replicas: int, *tail: str, backend: str = "torch") -> list[str]:
    poprun = [sys.executable, "-m", "poprun", "--num-instances", "1"]
    return [*poprun, "--num-replicas", str(replicas), "--backend", backend, *tail]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--graphs", default="on", help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=4, help="local replicas N")
    parser.add_argument("--micro", type=int, help="micro-batch per replica (default 256)")
    parser.add_argument("--width", type=int, help="hidden width of the MLP (default 2048)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--cpu", action="store_true", help="run the steps on the CPU")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny timings")
    parser.add_argument(
        "--sizes",
        default="",
        help="WIDTHxMICRO,... the MLPs to compare (default: --width x --micro if either is "
        "given, else 2048x256,4096x1024)",
    )
    parser.add_argument(
        "--save", action="store_true", help="write docs/gpu-check.{json,md} (this GPU's record)"
    )
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args)
        return 0
    given = args.width is not None or args.micro is not None
    default = f"{args.width or 2048}x{args.micro or 256}" if given else "2048x256,4096x1024"
    try:
        sizes = [_size(text) for text in (args.sizes or default).split(",")]
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
    started = time.monotonic()
    print(f"gpu-check on {name}, torch {torch.__version__}", flush=True)
    nccl = _launch(_poprun(1, *_me(args, *sizes[0]), "--worker", "nccl"))
    expect = "gloo" if args.cpu else "cpu:gloo,cuda:nccl"
    assert nccl["group"] == expect, nccl
    assert nccl["allreduce"] == [2.0] * 4, nccl
    print(f"1. {nccl['backend']} backend, process group {nccl['group']} on {nccl['device']}: ok")
    measured = {f"{w}x{m}": _replicas_vs_plain(args, w, m) for w, m in sizes}
    print(f"2. 1 instance x {args.replicas} local replicas on the device: ok", flush=True)
    captured = _capture(args, sizes[0])
    pipelined = _pipelined(args)
    print(f"4. the pipelined example on {', '.join(pipelined['gpu']['stage_devices'])}: ok")
    body = _table(name, nccl, sizes, measured, args.replicas, captured, pipelined)
    print(f"figures ({time.monotonic() - started:.0f} s):\n\n{body}")
    if args.save:
        _save(args, name, nccl, measured, body, captured, pipelined)
    return 0


def _capture(args: argparse.Namespace, size: tuple[int, int]) -> dict[str, Any]:
    """Step 2, in one launch of 1 instance x N local replicas (a smaller MLP's micro-batch)."""
    got = _launch(_poprun(args.replicas, *_me(args, size[0], 64), "--worker", "capture"))
    on = "cpu" if args.cpu else "cuda"
    assert got["param_device"].startswith(on), got
    assert got["captures"] == 1 and got["replays"] > 0, f"the step was not captured: {got}"
    assert got["bitwise_equal"] or got["max_rel_diff"] <= 1e-6, f"graphs on and off differ: {got}"
    syncs = got["syncs_graphs_on"]
    print(
        f"3. the micro-step captured once and replayed {got['replays']} times; graphs on and "
        f"off after {UPDATES} updates: "
        + ("bitwise equal" if got["bitwise_equal"] else f"max rel diff {got['max_rel_diff']:.2e}")
        + f"; syncs a training call: {syncs['sync_debug_warnings']} (device reads "
        f"{syncs['device_reads']}); replayed dropout masks equal: {got['masks_equal']}",
        flush=True,
    )
    return got


def _pipelined(args: argparse.Namespace) -> dict[str, Any]:
    """Step 4: interleaved rounds of the pipelined model on the GPU, its stages on the CPU
    (--offline-mode) and the same model unpipelined in plain torch on the GPU."""
    runs: dict[str, list[dict[str, Any]]] = {"gpu": [], "cpu": [], "plain": []}
    staged = ["--ipus-per-replica", "2"]
    for r in range(1 if args.quick else 2):
        for kind in ("gpu", "cpu", "plain") if r % 2 == 0 else ("plain", "cpu", "gpu"):
            me = [
                *_me(args, 0, 0),
                "--worker",
                "pipeline-" + ("plain" if kind == "plain" else "staged"),
            ]
            tail = ["--offline-mode", *staged] if kind == "cpu" else staged if kind == "gpu" else []
            runs[kind].append(_launch(_poprun(1, *tail, *me)))
    gpu, cpu, plain = runs["gpu"][0], runs["cpu"][0], runs["plain"][0]
    on = "cpu" if args.cpu else "cuda"
    assert all(d.startswith(on) for d in gpu["stage_devices"]) and gpu["output_device"] == "cpu", (
        gpu
    )
    assert cpu["stage_devices"] == ["cpu"], cpu
    import torch

    close = all(
        torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)
        for a, b in zip(gpu["weights_after_2"], plain["weights_after_2"], strict=True)
    )
    rate = {k: statistics.median(g["samples_per_s"] for g in v) for k, v in runs.items()}
    return {"gpu": gpu, "rates": rate, "weights_close_to_plain": close}


def _table(
    name: str,
    nccl: dict[str, Any],
    sizes: list[tuple[int, int]],
    measured: dict[str, dict[str, Any]],
    replicas: int,
    captured: dict[str, Any],
    pipelined: dict[str, Any],
) -> str:
    """The figures as a Markdown table (for docs/gpu-check.md and docs/performance.md)."""
    on, off = captured["syncs_graphs_on"], captured["syncs_graphs_off"]
    rows = [
        ("device", name),
        (f"gradient path ({nccl['group']}), 1 rank, algbw GB/s", ", ".join(
            f"{mb} MB {v:.1f}" for mb, v in nccl["algbw_gbps"].items())),
        ("the fused micro-step in a CUDA graph", f"captured {captured['captures']}, replayed "
            f"{captured['replays']} times"),
        (f"weights after {UPDATES} updates, graphs on vs off (goal: rtol 1e-6)",
            "bitwise equal" if captured["bitwise_equal"]
            else f"max rel diff {captured['max_rel_diff']:.2e}"),
        ("host syncs a training call, graphs on / off (goal: 1)",
            f"{on['sync_debug_warnings']} / {off['sync_debug_warnings']} (device reads "
            f"{on['device_reads']} / {off['device_reads']})"),
        ("replayed dropout masks equal eager ones", str(captured["masks_equal"])),
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
            (f"MLP width {w}, micro-batch {m}: graphs off / plain torch (control, 1 round)",
             f"{got['graphs_off_ratio']:.3f}"),
        ]  # fmt: skip
    rate = pipelined["rates"]
    rows += [
        ("pipelined example, 2 stages on " + ", ".join(pipelined["gpu"]["stage_devices"])
            + ", samples/s", f"{rate['gpu']:.0f}"),
        ("the same stages on CPU workers (--offline-mode), samples/s", f"{rate['cpu']:.0f}"),
        ("the same model unpipelined in plain torch on the GPU, samples/s", f"{rate['plain']:.0f}"),
        ("pipelined on the GPU / its stages on the CPU (goal > 1)",
            f"**{rate['gpu'] / rate['cpu']:.2f}**"),
        ("pipelined weights after 2 steps = plain torch's (rtol 1e-5)",
            str(pipelined["weights_close_to_plain"])),
    ]  # fmt: skip
    return "| figure | value |\n|---|---|\n" + "\n".join(f"| {f} | {v} |" for f, v in rows)


def _size(text: str) -> tuple[int, int]:
    """``WIDTHxMICRO`` (``--sizes``); ``ValueError`` for anything else."""
    width, _, micro = text.strip().partition("x")
    size = int(width), int(micro)
    if min(size) < 1:
        raise ValueError(text)
    return size


def _me(args: argparse.Namespace, width: int, micro: int, graphs: str = "on") -> list[str]:
    """This script as one launch's worker of the MLP of ``width`` on micro-batches of ``micro``."""
    me = [sys.executable, str(Path(__file__).resolve())]
    me += ["--micro", str(micro), "--width", str(width), "--graphs", graphs]
    me += ["--iters", str(args.iters), "--replicas", str(args.replicas)]
    return me + ["--cpu"] * args.cpu + ["--quick"] * args.quick


def _replicas_vs_plain(args: argparse.Namespace, width: int, micro: int) -> dict[str, Any]:
    """Interleaved rounds of the executor's local replicas (graphs on) and plain torch on the
    N x batch: each side's samples/s a round and the per-round ratios; then one round with
    graphs off, the control."""
    rates: dict[str, Any] = {"executor": [], "plain": []}
    on = "cpu" if args.cpu else "cuda"
    for r in range(1 if args.quick else args.rounds):
        for kind in ("executor", "plain") if r % 2 == 0 else ("plain", "executor"):
            me = _me(args, width, micro)
            if kind == "executor":
                got = _launch(_poprun(args.replicas, *me, "--worker", "executor"))
                assert got["param_device"].startswith(on) and got["output_device"] == "cpu", got
                assert got["weights_changed"] and got["replicas"] == args.replicas, got
                assert got["captures"] == 1, f"the step was not captured: {got}"
            else:
                got = _launch(_poprun(1, *me, "--worker", "plain"))
            rates[kind].append(got["samples_per_s"])
    rates["ratios"] = [e / p for e, p in zip(rates["executor"], rates["plain"], strict=True)]
    off = _launch(_poprun(args.replicas, *_me(args, width, micro, "off"), "--worker", "executor"))
    assert off["captures"] == 0, off
    rates["graphs_off"] = off["samples_per_s"]
    rates["graphs_off_ratio"] = off["samples_per_s"] / statistics.median(rates["plain"])
    return rates


def _save(
    args: argparse.Namespace,
    device: str,
    nccl: dict[str, Any],
    measured: dict[str, dict[str, Any]],
    body: str,
    captured: dict[str, Any],
    pipelined: dict[str, Any],
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
        "capture": {k: v for k, v in captured.items() if k != "stderr_notes"},
        "pipeline": {
            "rates": pipelined["rates"],
            "gpu_over_cpu": pipelined["rates"]["gpu"] / pipelined["rates"]["cpu"],
            "stage_devices": pipelined["gpu"]["stage_devices"],
            "weights_close_to_plain": pipelined["weights_close_to_plain"],
        },
    }
    save_results("gpu-check", record, cpu=f"{device} (host: {cpu_model()})")
    write_doc(
        "gpu-check.md", "The GPU path (make gpu-check)", f"On {device}.\n\n{body}\n\n{EXPLAINED}"
    )


if __name__ == "__main__":
    sys.exit(main())
