"""Allreduce bandwidth, 4 KB to 256 MB float32, side by side in one run.

The executor's gradient path (Horovod through ``popdist_torch.collectives``) against raw
mpi4py ``Allreduce`` and torch.distributed gloo, each launched as ``mpirun -np 2``, rounds
interleaved; numpy ``c = a + b`` on the same sizes gives this machine's memory-bandwidth
reference. Reports algbw = S/t and busbw = algbw·2(n-1)/n (nccl-tests' definitions).

With ``--baseline DIR`` (the packages at an earlier commit) a ``horovod (before)`` backend
times that version's gradient path in the same interleaved rounds.

    .venv/bin/python benchmarks/allreduce.py [--rounds 3] [--quick] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DOCS, MPIRUN_BASE, ROOT, Summary, table, write_doc

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
BACKENDS = ["horovod", "mpi4py", "gloo", "memory"]
RANKS = 2


def run_backend(backend: str, sizes: list[int], baseline: str | None = None) -> dict[int, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "HOROVOD_"))}
    if backend == "horovod (before)":
        backend = "horovod"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [baseline, env.get("PYTHONPATH")]))
    argv = [
        *MPIRUN_BASE,
        "-np",
        str(RANKS),
        "-x",
        "OMP_NUM_THREADS=1",
        sys.executable,
        str(ROOT / "benchmarks" / "allreduce_worker.py"),
        "--backend",
        backend,
        "--sizes",
        ",".join(map(str, sizes)),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT, env=env).stdout
    return {r["bytes"]: r["seconds"] for r in map(json.loads, filter(None, out.splitlines()))}


def human(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="sizes up to 16 MB only")
    parser.add_argument("--baseline", help="packages of an earlier commit, for a before row")
    args = parser.parse_args()
    sizes = [s for s in SIZES if not args.quick or s <= 16 << 20]
    backends = BACKENDS + (["horovod (before)"] if args.baseline else [])

    samples: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in range(args.rounds):
        for backend in backends[r % len(backends) :] + backends[: r % len(backends)]:
            for size, secs in run_backend(backend, sizes, args.baseline).items():
                samples[backend][size].append(secs)

    busfactor = 2 * (RANKS - 1) / RANKS
    rows, results = [], {}
    for size in sizes:
        summ = {b: Summary(tuple(samples[b][size])) for b in backends}
        med = {b: summ[b].median for b in backends}
        algbw = {b: size / med[b] / 1e9 for b in backends}
        spread = {  # algbw of the slowest and the fastest round
            b: [size / max(summ[b].samples) / 1e9, size / min(summ[b].samples) / 1e9]
            for b in backends
        }
        results[size] = {"algbw": algbw, "median_s": med, "algbw_range": spread}
        rows.append(
            [
                human(size),
                *(
                    f"{algbw[b]:.2f} / {algbw[b] * busfactor:.2f}"
                    for b in ("horovod", "mpi4py", "gloo")
                ),
                f"{algbw['memory']:.2f}",
                f"{algbw['horovod'] / algbw['mpi4py']:.2f}",
                f"{100 * algbw['horovod'] / algbw['memory']:.0f}%",
                f"{100 * algbw['mpi4py'] / algbw['memory']:.0f}%",
                *([f"{algbw['horovod (before)']:.2f}"] if "horovod (before)" in algbw else []),
            ]
        )
    body = (
        f"{RANKS} ranks, float32 sum, in place; median of {args.rounds} interleaved launches, each "
        "the slowest rank's median over repeated calls. algbw / busbw in GB/s (busbw = algbw·2(n-1)/n; "
        "for 2 ranks they are equal). `memory` is numpy `c = a + b` over the same size in one process "
        "(GB/s of S): the memory-bandwidth reference. Spread (slowest–fastest round) is in "
        "docs/allreduce.json.\n\n"
        + table(
            [
                "size",
                "popdist_torch (Horovod)",
                "mpi4py Allreduce",
                "torch gloo",
                "numpy a+b",
                "Horovod / MPI",
                "Horovod % of a+b",
                "MPI % of a+b",
                *(["gradient path before"] if args.baseline else []),
            ],
            rows,
        )
    )
    path = write_doc("allreduce.md", "Allreduce bandwidth", body)
    (DOCS / "allreduce.json").write_text(
        json.dumps({str(k): v for k, v in results.items()}, indent=1)
    )
    _plot(sizes, results)
    print(path.read_text())


def _plot(sizes: list[int], results: dict[int, dict[str, dict[str, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for b, label in (
        ("horovod", "popdist_torch (Horovod)"),
        ("mpi4py", "mpi4py Allreduce"),
        ("gloo", "torch gloo"),
        ("memory", "numpy a+b (memory)"),
    ):
        ax.plot(
            [s / 2**20 for s in sizes],
            [results[s]["algbw"][b] for s in sizes],
            marker="o",
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("buffer size (MB)")
    ax.set_ylabel("algbw (GB/s)")
    ax.set_title(f"Allreduce, {RANKS} ranks, float32")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(DOCS / "allreduce.png", dpi=110)


if __name__ == "__main__":
    main()
