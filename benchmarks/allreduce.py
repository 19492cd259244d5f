"""Allreduce bandwidth, 4 KB to 256 MB float32, side by side in one run.

The executor's gradient path (Horovod through ``popdist.collectives``) against raw
mpi4py ``Allreduce`` and torch.distributed gloo, each launched by poprun as 2 instances (so
every backend runs with the same Open MPI settings, those the product runs with). In each
round every backend's job is launched at once and the jobs take turns, a block of calls each
(``benchmarks/_turns.py``), so the blocks compared lie seconds apart and not a launch apart;
numpy ``c = a + b`` on the same sizes gives this machine's memory-bandwidth reference.
Reports algbw = S/t and busbw = algbw·2(n-1)/n (nccl-tests' definitions).

The page size of the buffer matters as much as the path: Open MPI's shared-memory copy
(CMA) walks the source one page at a time, and a 16 MB buffer runs about twice as fast on
2 MB pages. poprun's allocator defaults back glibc's heap, where torch's allocator takes a
gradient from, with 2 MB pages (``glibc.malloc.hugetlb=1``, ``poprun.plan.environment``).
So each path is compared on three kinds of memory:

- *4 KB pages*: a buffer from torch's allocator on glibc's 4 KB heap (the cases force
  ``glibc.malloc.hugetlb=0``: a user who opts out, or a kernel without huge pages);
- *2 MB pages*: raw MPI on a numpy array (numpy advises huge pages for large arrays) and the
  gradient path with ``THP_MEM_ALLOC_ENABLE=1`` (torch's allocator advises them), also on
  ``hugetlb=0``, as the goal rows have measured them since issue 7;
- *poprun's default*: both on torch's allocator over glibc's heap on 2 MB pages, as a job
  gets it (``-default`` cases, no allocator variable of the benchmark's own).

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
BACKENDS = [
    "horovod", "mpi4py", "horovod-2mb", "mpi4py-numpy", "horovod-default", "mpi4py-default",
    "gloo", "memory",
]  # fmt: skip
#: Variables that change what is measured; cleared so that the caller's shell cannot skew it.
_CLEARED = ("THP_MEM_ALLOC_ENABLE", "NUMPY_MADVISE_HUGEPAGE", "OMP_NUM_THREADS", "GLIBC_TUNABLES")
#: Every case but the ``-default`` ones keeps glibc's heap on 4 KB pages (poprun still gives
#: them its malloc thresholds: the hugetlb tunable alone is not a choice of thresholds).
_SMALL_PAGES = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
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
        if not k.startswith(("OMPI_", "PMIX_", "HOROVOD_", "MALLOC_")) and k not in _CLEARED
    }
    if backend.endswith("-default"):
        backend = backend.removesuffix("-default")  # poprun's allocator defaults, as they are
    else:
        env.update(_SMALL_PAGES)
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

    def settled() -> bool:  # every goal size clears 0.9 with margin, on both goals' memory
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
            "default": _paired(blocks["horovod-default"][size], blocks["mpi4py-default"][size]),
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
                    for b in BACKENDS
                    if b != "memory"
                ),
                f"{algbw['memory']:.2f}",
                f"**{results[size]['ratio']['4k_pages']:.2f}**",
                f"**{results[size]['ratio']['2m_pages']:.2f}**",
                f"{results[size]['ratio']['default']:.2f}",
                f"{med['horovod'] / med['horovod-default']:.2f}×",
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
        "for 2 ranks they are equal). Each path on three kinds of memory: *4 KB pages* is a "
        "buffer from torch's allocator on glibc's heap with `glibc.malloc.hugetlb=0`; *2 MB "
        "pages* is a numpy array (numpy advises huge pages for large arrays) for raw MPI and "
        "`THP_MEM_ALLOC_ENABLE=1` for the gradient path (also `hugetlb=0`: the goals' memory "
        "since issue 7); *default* is torch's allocator on glibc's heap on 2 MB pages, as "
        "poprun's allocator defaults give every job (`glibc.malloc.hugetlb=1`); *default "
        "speed-up* is the gradient path's time on 4 KB pages over its time on the default. "
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
                "gradient path, default",
                "mpi4py Allreduce, default",
                "torch gloo",
                "numpy a+b",
                "path / MPI, 4 KB",
                "path / MPI, 2 MB",
                "path / MPI, default",
                "default speed-up",
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
        ("horovod-default", "gradient path, poprun's default (heap on 2 MB pages)"),
        ("mpi4py-default", "mpi4py Allreduce, poprun's default"),
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
