"""Allreduce bandwidth, 4 KB to 256 MB float32, side by side in one run.

The executor's gradient path (Horovod through ``popdist.collectives``) against raw
mpi4py ``Allreduce`` and torch.distributed gloo, each launched by poprun as 2 instances (so
every backend runs with the same Open MPI settings, those the product runs with). In each
round every backend's job is launched at once and the jobs take turns, a block of calls each
(``benchmarks/_turns.py``), so the blocks compared lie seconds apart and not a launch apart;
numpy ``c = a + b`` on the same sizes gives this machine's memory-bandwidth reference.
Reports algbw = S/t and busbw = algbw·2(n-1)/n (nccl-tests' definitions).

The page size of the buffer matters as much as the path: numpy asks the kernel for 2 MB
pages on large arrays (``madvise(MADV_HUGEPAGE)``), torch's allocator does not unless
``THP_MEM_ALLOC_ENABLE=1``, and Open MPI's shared-memory copy of a 16 MB buffer runs
about 1.6x faster on 2 MB pages. So each path is compared on both kinds of memory: raw
MPI on a torch-allocated buffer (4 KB pages, where gradients live) and on a numpy array
(2 MB pages), the gradient path as it runs and with ``THP_MEM_ALLOC_ENABLE=1``.

With ``--baseline DIR`` (the packages at an earlier commit) a ``horovod (before)`` backend
times that version's gradient path in the same rounds (launched alone: its worker takes no
turns).

    .venv/bin/python benchmarks/allreduce.py [--rounds 3] [--quick] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DOCS, ROOT, Summary, rounds_until_clear, save_results, table, write_doc
from _turns import TurnJob, block_ratio, block_times, take_turns, worker_lines
from goals import clears

SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
BACKENDS = ["horovod", "mpi4py", "horovod-2mb", "mpi4py-numpy", "gloo", "memory"]
#: Variables that change what is measured; cleared so that the caller's shell cannot skew it.
_CLEARED = ("THP_MEM_ALLOC_ENABLE", "NUMPY_MADVISE_HUGEPAGE", "OMP_NUM_THREADS")
RANKS = 2
#: The goal (issue 7): the gradient path ≥ 0.9× raw MPI from 16 MB.
GOAL, GOAL_FROM = 0.9, 16 << 20
WORKER = ROOT / "benchmarks" / "allreduce_worker.py"
#: Blocks per size and launch: each backend's blocks alternate with the others' (issue 33).
BLOCKS = 5


def _launch(
    backend: str, sizes: list[int], baseline: str | None
) -> tuple[list[str], dict[str, str], Path]:
    """The poprun command of one backend's job, its environment and directory."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMIX_", "HOROVOD_")) and k not in _CLEARED
    }
    cwd, worker = ROOT, WORKER
    if backend == "horovod (before)":
        # The before column runs the earlier commit's own worker: this one imports modules
        # (``popdist_torch.execution``) that the earlier layout does not have.
        backend, cwd = "horovod", Path(baseline or ROOT)
        worker = cwd / "benchmarks" / "allreduce_worker.py"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [baseline, env.get("PYTHONPATH")]))
    if backend == "horovod-2mb":
        backend = "horovod"
        env["THP_MEM_ALLOC_ENABLE"] = "1"  # torch's allocator advises 2 MB pages too
    env["OMP_NUM_THREADS"] = "1"
    # ``python -m poprun`` from the directory whose packages run: the baseline's own poprun
    # for the before column (its launcher defaults were part of what changed).
    poprun = [sys.executable, "-m", "poprun", "--num-instances", str(RANKS)]
    argv = [*poprun, "--num-replicas", str(RANKS), sys.executable, str(worker)]
    argv += ["--backend", backend, "--sizes", ",".join(map(str, sizes))]
    return argv, env, cwd


def run_backend(backend: str, sizes: list[int], baseline: str | None = None) -> dict[int, float]:
    """One launch of ``backend`` alone: the slowest rank's median per size."""
    argv, env, cwd = _launch(backend, sizes, baseline)
    out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=cwd, env=env).stdout
    return {r["bytes"]: r["seconds"] for r in worker_lines(out)}


def run_side_by_side(backends: list[str], sizes: list[int]) -> dict[str, dict[int, list[float]]]:
    """Every backend's job launched at once, taking turns block by block
    (``benchmarks/_turns.py``): per backend and size, the slowest rank's median of each block."""
    jobs = {}
    for backend in backends:
        argv, env, cwd = _launch(backend, sizes, None)
        jobs[backend] = TurnJob([*argv, "--blocks", str(BLOCKS)], env, cwd, RANKS)
    return block_times(take_turns(jobs, len(sizes) * BLOCKS))


def _paired(path_blocks: list[list[float]], mpi_blocks: list[list[float]]) -> list[float]:
    """Per-round bandwidth ratios path / MPI: in each round, the median over the pairs of
    blocks the two jobs timed next to each other (their times, in turn order)."""
    return [block_ratio(path, mpi) for path, mpi in zip(path_blocks, mpi_blocks, strict=True)]


def human(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="sizes up to 16 MB only")
    parser.add_argument("--baseline", help="packages of an earlier commit, for a before row")
    parser.add_argument("--max-rounds", type=int, default=12, help="more rounds until margin")
    parser.add_argument("--budget", type=float, default=360, help="seconds for the rounds")
    args = parser.parse_args()
    sizes = [s for s in SIZES if not args.quick or s <= 16 << 20]
    backends = BACKENDS + (["horovod (before)"] if args.baseline else [])

    samples: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    blocks: dict[str, dict[int, list[list[float]]]] = defaultdict(lambda: defaultdict(list))

    def settled() -> bool:  # every goal size clears 0.9 with margin, on both kinds of memory
        return all(
            clears(_paired(blocks[a][size], blocks[b][size]), GOAL, "≥")
            for size in sizes
            if size >= GOAL_FROM
            for a, b in (("horovod", "mpi4py"), ("horovod-2mb", "mpi4py-numpy"))
        )

    def one_round(r: int) -> None:
        order = BACKENDS[r % len(BACKENDS) :] + BACKENDS[: r % len(BACKENDS)]
        for backend, got_blocks in run_side_by_side(order, sizes).items():
            for size, times in got_blocks.items():
                blocks[backend][size].append(times)
                samples[backend][size].append(statistics.median(times))
        if "horovod (before)" in backends:  # the earlier worker takes no turns: alone
            try:
                got = run_backend("horovod (before)", sizes, args.baseline)
            except subprocess.CalledProcessError as failed:
                # The earlier commit's packages no longer run beside today's environment:
                # the before column is left out, the measured rows and the goals stand.
                tail = (failed.stderr or "").strip().splitlines()[-1:]
                print(f"before column left out: {' '.join(tail)}", file=sys.stderr)
                backends.remove("horovod (before)")
                samples.pop("horovod (before)", None)
                return
            for size, secs in got.items():
                samples["horovod (before)"][size].append(secs)

    rounds = rounds_until_clear(
        one_round, args.rounds, settled=settled, max_rounds=args.max_rounds, budget_s=args.budget
    )

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
        # Path / MPI from blocks the two jobs timed next to each other (seconds apart, so the
        # machine's drift cancels), the median over a round's blocks, then over rounds.
        paired = {
            "4k_pages": _paired(blocks["horovod"][size], blocks["mpi4py"][size]),
            "2m_pages": _paired(blocks["horovod-2mb"][size], blocks["mpi4py-numpy"][size]),
        }
        results[size]["ratio"] = {k: statistics.median(v) for k, v in paired.items()}
        results[size]["ratio_range"] = {k: [min(v), max(v)] for k, v in paired.items()}
        results[size]["ratios"] = paired  # per round: the spread the goals' margin reads
        results[size]["rounds"] = rounds
        rows.append(
            [
                human(size),
                *(
                    f"{algbw[b]:.2f} / {algbw[b] * busfactor:.2f}"
                    for b in ("horovod", "mpi4py", "horovod-2mb", "mpi4py-numpy", "gloo")
                ),
                f"{algbw['memory']:.2f}",
                f"**{results[size]['ratio']['4k_pages']:.2f}**",
                f"**{results[size]['ratio']['2m_pages']:.2f}**",
                f"{100 * algbw['horovod-2mb'] / algbw['memory']:.0f}%",
                *([f"{algbw['horovod (before)']:.2f}"] if "horovod (before)" in algbw else []),
            ]
        )
    body = (
        f"{RANKS} ranks, float32 sum, in place; median of {rounds} rounds "
        f"(at least {args.rounds}, more until the goals clear with margin). In a round every "
        f"backend's job runs at once and they take turns, {BLOCKS} blocks of calls per size "
        "each (`benchmarks/_turns.py`); a figure is the slowest rank's median per block, "
        "then the median over blocks. algbw / busbw in GB/s (busbw = algbw·2(n-1)/n; "
        "for 2 ranks they are equal). Each path on both kinds of memory: *4 KB pages* is a buffer "
        "from torch's allocator as gradients get it; *2 MB pages* is a numpy array (numpy advises "
        "huge pages for large arrays) for raw MPI and `THP_MEM_ALLOC_ENABLE=1` for the gradient path. "
        "`memory` is numpy `c = a + b` over the same size in one process (GB/s of S): the "
        "memory-bandwidth reference. The goal (gradient path ≥ 0.9× raw MPI from 16 MB) is the "
        "ratio on the same memory, taken per pair of blocks timed next to each other, the "
        "median of those per round, then the median over rounds. Spread (slowest–fastest round, and the range "
        "of the per-round ratios) is in docs/allreduce.json.\n\n"
        + table(
            [
                "size",
                "gradient path (Horovod), 4 KB pages",
                "mpi4py Allreduce, 4 KB pages",
                "gradient path, 2 MB pages",
                "mpi4py Allreduce, 2 MB pages",
                "torch gloo",
                "numpy a+b",
                "path / MPI, 4 KB",
                "path / MPI, 2 MB",
                "path (2 MB) % of a+b",
                *(["gradient path before"] if "horovod (before)" in backends else []),
            ],
            rows,
        )
    )
    path = write_doc("allreduce.md", "Allreduce bandwidth", body)
    save_results("allreduce", {str(k): v for k, v in results.items()})
    _plot(sizes, results)
    print(path.read_text())


def _plot(sizes: list[int], results: dict[int, dict[str, dict[str, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for b, label in (
        ("horovod", "gradient path (Horovod), 4 KB pages"),
        ("mpi4py", "mpi4py Allreduce, 4 KB pages"),
        ("horovod-2mb", "gradient path, 2 MB pages"),
        ("mpi4py-numpy", "mpi4py Allreduce, 2 MB pages"),
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
