"""Inside one Slurm allocation: launch + start the backend, poprun against its peers, interleaved.

A real two-node Slurm cluster on this machine (``tests/support/slurm_cluster.py``: slurmctld
and slurmd ``n1``, ``n2``); one allocation, ``salloc -N2 --ntasks-per-node=1``, holds the
whole measurement: this script runs again inside it (``--inside``) and times, in rotating
order each round, one launch of 2 instances (one per node) by

- ``poprun``: ``poprun --num-instances 2 --num-replicas 2 python -c "import popdist;
  popdist.init()"``, no host list (the allocation is the host source);
- ``mpirun``: ``mpirun -np 2 python -c "import horovod.torch as hvd; hvd.init()"``, no host
  list (Open MPI reads the allocation too): the anchor;
- ``torchrun``: started once per node by ``srun -N2 --ntasks-per-node=1``, as Slurm users
  must (``torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint
  localhost:PORT --local-addr 127.0.0.1``), the program ``init_process_group("gloo")`` + a
  barrier. Both nodes are this machine: each node's hostname (``n1``, ``n2``) resolves to
  nothing, so torchrun is told its address, as one does on a cluster whose hostnames are
  not the interconnect's; c10d ignores ``--node-rank``.

Both node names are this machine, so the figures are launch costs (Slurm's step launch,
Open MPI's daemons, Python start-up), not a network. Needs root and ``slurm-wlm``; elsewhere
it says why and writes nothing.

    .venv/bin/python benchmarks/slurm.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from _common import ROOT, Summary, interleave, save_results, table, which, write_doc

from tests.support.slurm_cluster import SlurmCluster, unavailable

PY = sys.executable
INIT_POPDIST = "import popdist; popdist.init()"
INIT_HOROVOD = "import horovod.torch as hvd; hvd.init()"
INIT_TORCH = (
    "import torch.distributed as d; d.init_process_group('gloo'); d.barrier(); "
    "d.destroy_process_group()"
)
POPRUN, MPIRUN, TORCHRUN = "poprun", "mpirun + hvd.init()", "torchrun per node (srun)"
LAUNCHERS = (POPRUN, MPIRUN, TORCHRUN)
ALLOC = ["-N2", "--ntasks-per-node=1"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launches() -> dict[str, list[str]]:
    """launcher → the argv of one launch of 2 instances (run inside the allocation)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    poprun = [which("poprun"), "--num-instances", "2", "--num-replicas", "2"]
    mpirun = ["mpirun", *root, "--bind-to", "none", "-np", "2"]
    mpirun += ["-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"]
    torchrun = (
        f"exec {which('torchrun')} --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d "
        "--rdzv-endpoint localhost:{port} --local-addr 127.0.0.1 --rdzv-id bench --no-python "
        f'{PY} -c "{INIT_TORCH}"'
    )
    return {
        POPRUN: [*poprun, PY, "-c", INIT_POPDIST],
        MPIRUN: [*mpirun, PY, "-c", INIT_HOROVOD],
        TORCHRUN: ["srun", *ALLOC, "sh", "-c", torchrun],
    }


def _wall(argv: list[str]) -> float:
    """Wall time of one launch, which must succeed (a fresh rendezvous port each time)."""
    argv = [word.replace("{port}", str(_free_port())) for word in argv]
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... failed: {done.stderr[-2000:]}")
    return elapsed


def inside(rounds: int, out: Path) -> int:
    """In the allocation: one untimed warm-up each, then the interleaved rounds, as JSON."""
    if not os.environ.get("SLURM_JOB_ID"):
        print("--inside runs in a Slurm allocation (salloc)", file=sys.stderr)
        return 2
    jobs = launches()
    cases: dict[str, Callable[[], float]] = {
        name: functools.partial(_wall, jobs[name]) for name in LAUNCHERS
    }
    for case in cases.values():
        case()
    got = interleave(cases, rounds)
    out.write_text(json.dumps({name: list(s.samples) for name, s in got.items()}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--inside", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside is not None:
        return inside(args.rounds, args.inside)
    reason = unavailable()
    if reason is not None:
        print(f"Slurm benchmark not run: {reason}")
        return 0
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with SlurmCluster(nodes=2, cpus=4) as slurm, tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "samples.json"
        me = [PY, str(Path(__file__).resolve()), "--rounds", str(args.rounds), "--inside"]
        done = slurm.salloc(ALLOC, [*me, str(result)], env=slurm.env(None, **env),
                            timeout=120 + 60 * args.rounds)  # fmt: skip
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"the measurement inside the allocation failed:\n{done.stdout}")
        samples = json.loads(result.read_text())
        left = slurm.wait_clean(within=15.0)
        if left:
            raise RuntimeError(f"left on the Slurm cluster: {left}")
    launch = {name: Summary(tuple(samples[name])) for name in LAUNCHERS}
    med = {name: s.median for name, s in launch.items()}
    ratios = {
        "poprun_vs_mpirun": med[POPRUN] / med[MPIRUN],
        "poprun_vs_torchrun": med[POPRUN] / med[TORCHRUN],
    }
    body = "\n\n".join(
        [
            "A two-node Slurm cluster on this one machine (`tests/support/slurm_cluster.py`: "
            "slurmctld, slurmd `n1` and `n2`), one allocation (`salloc -N2 "
            "--ntasks-per-node=1`) for every launch, 2 instances, one per node. No launcher "
            "is given a host list: poprun and mpirun read the allocation; torchrun is started "
            "on each node by `srun`, its c10d rendezvous on localhost and `--local-addr "
            "127.0.0.1` (both nodes are this machine). The figures are launch costs "
            "(Slurm's step launch, Open MPI's daemons, Python start-up, the backend's "
            "start), not a network. The machine's load average (first line) counts the other "
            "jobs it ran meanwhile.",
            f"### Launch + start the backend, 2 nodes (median of {args.rounds} interleaved rounds)",
            table(
                ["launcher", "program", "wall time"],
                [
                    [POPRUN, "`popdist.init()` (Horovod)", launch[POPRUN].fmt()],
                    [MPIRUN, "`hvd.init()`", launch[MPIRUN].fmt()],
                    [TORCHRUN, "`init_process_group` (gloo) + barrier", launch[TORCHRUN].fmt()],
                ],
            ),
            f"- poprun / mpirun + hvd.init() = {ratios['poprun_vs_mpirun']:.2f}×\n"
            f"- poprun / torchrun per node = {ratios['poprun_vs_torchrun']:.2f}×",
        ]
    )
    path = write_doc("slurm-benchmark.md", "Inside a Slurm allocation: launch", body)
    save_results(
        "slurm-benchmark",
        {
            "launch": {
                n: {"median": s.median, "iqr": s.iqr, "samples": s.samples}
                for n, s in launch.items()
            },
            "ratios": ratios,
            "rounds": args.rounds,
        },
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
