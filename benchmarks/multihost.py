"""Across two hosts: launch + ``popdist.init()`` and gradient allreduce, side by side in one run.

The hosts are network namespaces with sshd on this machine (``tests/multihost/hosts.py``):
what is measured is launch cost (ssh, Open MPI's daemons, Python) and the TCP path between
hosts, not a real network. Every job starts on h1; rounds are interleaved.

Launch (one instance per host, the program starts its backend):

- ``poprun``: ``poprun -H h1,h2 --num-instances 2 python -c "import popdist; popdist.init()"``,
  as users run it (its ssh check of h2 included), and with ``--ssh-check=no``;
- ``mpirun``: bare ``mpirun -H h1:1,h2:1 -np 2`` with the same program (``popdist.init()``
  reads Open MPI's ranks);
- ``torchrun``: ``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d`` started on
  both hosts at once (node 2 started directly, as a scheduler would, no ssh), program
  ``init_process_group("gloo")`` + a barrier.

Allreduce: ``benchmarks/allreduce_worker.py`` as two poprun instances on h1 and h2: the
executor's gradient path (Horovod) against raw mpi4py ``MPI_Allreduce`` on the same kind of
buffer (torch's allocator), 16 to 256 MB. Both jobs are launched at once and take turns,
block by block (``benchmarks/_turns.py``): a round's ratio is the median over pairs of
blocks timed next to each other, then the median over rounds.

Needs root (namespaces); elsewhere it says why and writes nothing.

    .venv/bin/python benchmarks/multihost.py [--rounds 7] [--allreduce-rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from _common import ROOT, interleave, rounds_until_clear, save_results, table, write_doc
from _turns import TurnJob, block_ratio, block_times, take_turns
from goals import clears

from tests.multihost.hosts import Hosts, unavailable

PY = sys.executable
INIT_POPDIST = "import popdist; popdist.init()"
INIT_TORCH = (
    "import torch.distributed as d; d.init_process_group('gloo'); d.barrier(); "
    "d.destroy_process_group()"
)
SIZES = [16 << 20, 64 << 20, 256 << 20]
WORKER = ROOT / "benchmarks" / "allreduce_worker.py"
#: Blocks per size and round: the two backends' blocks alternate (issue 33).
BLOCKS = 5
LAUNCHERS = ("poprun", "poprun --ssh-check=no", "mpirun", "torchrun --nnodes 2")


def _env(hosts: Hosts) -> dict[str, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMIX_", "POPDIST_", "HOROVOD_"))
    }
    base.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return hosts.env(base)


def _wall(hosts: Hosts, jobs: Sequence[tuple[str, list[str]]], env: dict[str, str]) -> float:
    """Wall time until every ``(host, argv)`` job has ended; each must succeed."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            hosts.on(host, argv, cwd=str(ROOT)),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for host, argv in jobs
    ]
    errors = [p.communicate()[1] for p in procs]
    elapsed = time.perf_counter() - t0
    for proc, err, (_, argv) in zip(procs, errors, jobs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {err.decode()[-2000:]}")
    return elapsed


def launch_jobs(port: int) -> dict[str, list[tuple[str, list[str]]]]:
    """launcher -> the ``(host, argv)`` jobs of one launch."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    poprun = [PY, "-m", "poprun", "--num-instances", "2", "--num-replicas", "2", "-H", "h1,h2"]
    mpirun = ["mpirun", *root, "--bind-to", "none", "-H", "h1:1,h2:1", "-np", "2"]
    mpirun += ["-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"]
    torchrun = [
        str(Path(PY).parent / "torchrun"), "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"h1:{port}", "--rdzv-id", "bench",
        "--no-python", PY, "-c", INIT_TORCH,
    ]  # fmt: skip
    return {
        "poprun": [("h1", [*poprun, PY, "-c", INIT_POPDIST])],
        "poprun --ssh-check=no": [("h1", [*poprun, "--ssh-check=no", PY, "-c", INIT_POPDIST])],
        "mpirun": [("h1", [*mpirun, PY, "-c", INIT_POPDIST])],
        "torchrun --nnodes 2": [("h1", torchrun), ("h2", torchrun)],
    }


def allreduce_side_by_side(
    hosts: Hosts, backends: Sequence[str], env: dict[str, str]
) -> dict[str, dict[int, list[float]]]:
    """Each backend's worker on h1 and h2, the jobs launched at once and taking turns
    (``benchmarks/_turns.py``); backend -> size -> the slowest rank's median of each block."""
    jobs = {}
    for backend in backends:
        argv = [PY, "-m", "poprun", "--num-instances", "2", "--num-replicas", "2", "-H", "h1,h2"]
        argv += [PY, str(WORKER), "--backend", backend, "--sizes", ",".join(map(str, SIZES))]
        argv += ["--blocks", str(BLOCKS)]
        jobs[backend] = TurnJob(hosts.on("h1", argv, cwd=str(ROOT)), env, ROOT, 2)
    return block_times(take_turns(jobs, len(SIZES) * BLOCKS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="launch rounds")
    parser.add_argument("--max-rounds", type=int, default=14, help="launch rounds until margin")
    parser.add_argument("--allreduce-rounds", type=int, default=5)
    parser.add_argument("--max-allreduce-rounds", type=int, default=10, help="until margin")
    parser.add_argument("--allreduce-budget", type=float, default=300, help="seconds")
    args = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        print(f"multihost benchmark not run: {reason}")
        return 0

    with Hosts(2) as hosts:
        env = _env(hosts)
        ports = iter(range(29600, 29600 + 10 * args.rounds + 100))
        cases = {
            name: (lambda n=name: _wall(hosts, launch_jobs(next(ports))[n], env))
            for name in LAUNCHERS
        }
        for case in cases.values():  # warm the page cache and sshd once, untimed
            case()

        def launch_clear(got: dict[str, list[float]]) -> bool:  # both launch goals, with margin
            def each(anchor: str) -> list[float]:
                return [p / a for p, a in zip(got["poprun"], got[anchor], strict=True)]

            return clears(each("mpirun"), 1.1, "≤") and clears(
                each("torchrun --nnodes 2"), 1.0, "<"
            )

        launch = interleave(
            cases, args.rounds, until=launch_clear, max_rounds=args.max_rounds, budget_s=240
        )

        samples: dict[str, dict[int, list[float]]] = {b: {s: [] for s in SIZES} for b in
                                                       ("horovod", "mpi4py")}  # fmt: skip
        paired: dict[int, list[float]] = {s: [] for s in SIZES}  # per round

        def one_round(r: int) -> None:
            order = ["horovod", "mpi4py"] if r % 2 == 0 else ["mpi4py", "horovod"]
            got = allreduce_side_by_side(hosts, order, env)
            for size in SIZES:
                for backend in order:
                    samples[backend][size].append(statistics.median(got[backend][size]))
                paired[size].append(block_ratio(got["horovod"][size], got["mpi4py"][size]))

        def settled() -> bool:  # every size clears the 0.9 goal with margin (issue 33)
            return all(clears(paired[s], 0.9, "≥") for s in SIZES)

        allreduce_rounds = rounds_until_clear(
            one_round, args.allreduce_rounds, settled=settled,
            max_rounds=args.max_allreduce_rounds, budget_s=args.allreduce_budget,
        )  # fmt: skip
        left = hosts.wait_clean(within=10.0)
        if left:
            raise RuntimeError(f"processes left on the hosts: {left}")

    med = {name: s.median for name, s in launch.items()}
    ratios = {
        "poprun_vs_mpirun": med["poprun"] / med["mpirun"],
        "poprun_no_check_vs_mpirun": med["poprun --ssh-check=no"] / med["mpirun"],
        "poprun_vs_torchrun": med["poprun"] / med["torchrun --nnodes 2"],
    }
    allreduce: dict[str, dict[str, object]] = {}
    rows = []
    for size in SIZES:
        per_round = paired[size]
        bw = {b: size / statistics.median(samples[b][size]) / 1e9 for b in samples}
        allreduce[str(size)] = {
            "algbw": bw,
            "ratio": statistics.median(per_round),
            "ratio_range": [min(per_round), max(per_round)],
            "ratios": per_round,  # per round: the spread the goal's margin reads
        }
        rows.append(
            [
                f"{size >> 20} MB",
                f"{bw['horovod']:.3f}",
                f"{bw['mpi4py']:.3f}",
                f"**{statistics.median(per_round):.2f}** ({min(per_round):.2f}–{max(per_round):.2f})",
            ]
        )
    body = "\n\n".join(
        [
            "Two hosts made of network namespaces with sshd on this one machine "
            "(`tests/multihost/hosts.py`), one instance per host, every job started on h1. "
            "The figures measure launch cost (ssh, Open MPI's daemons, Python start-up) and "
            "the TCP path between namespaces, not a real network. Both hosts share this "
            "machine's cores, so each host's threads compete with the other host's: "
            "Horovod's two busy threads per instance (the background thread in MPI, the "
            "training thread waiting on it) against raw MPI's one; from 4 MB the waiting "
            "thread naps instead of polling (`popdist/collectives/horovod.py`). "
            "The machine's load average (first line) counts the other jobs it ran meanwhile.",
            f"### Launch + start the backend, 2 hosts (median of {len(launch['poprun'].samples)} "
            "interleaved rounds)",
            table(
                ["launcher", "wall time"],
                [[name, launch[name].fmt()] for name in LAUNCHERS],
            ),
            f"- poprun / bare mpirun = {ratios['poprun_vs_mpirun']:.2f}× "
            f"(without the ssh check: {ratios['poprun_no_check_vs_mpirun']:.2f}×)\n"
            f"- poprun / torchrun --nnodes 2 = {ratios['poprun_vs_torchrun']:.2f}×\n"
            "- torchrun's second node is started directly on h2 (no ssh), as a scheduler "
            "would start it; poprun and mpirun reach h2 by ssh.",
            f"### Gradient allreduce across the 2 hosts ({allreduce_rounds} rounds)",
            "The executor's gradient path (Horovod, one parameter of the size) against raw "
            "mpi4py `MPI_Allreduce` on a buffer from torch's allocator, both launched by "
            "poprun on h1 and h2, at once, the two jobs taking turns block by block "
            f"({BLOCKS} blocks a size, `benchmarks/_turns.py`); algbw in GB/s from the median "
            "over rounds; a round's ratio is the median over pairs of blocks timed next to "
            "each other, then the median over rounds (range in brackets).",
            table(["size", "gradient path", "raw MPI_Allreduce", "path / MPI"], rows),
        ]
    )
    path = write_doc("multihost-benchmark.md", "Across hosts: launch and allreduce", body)
    save_results(
        "multihost-benchmark",
        {
            "launch": {
                n: {"median": s.median, "iqr": s.iqr, "samples": s.samples}
                for n, s in launch.items()
            },
            "ratios": ratios,
            "allreduce": allreduce,
            "rounds": len(launch["poprun"].samples),
            "allreduce_rounds": allreduce_rounds,
        },
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
