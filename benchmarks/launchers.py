"""Launch time of poprun, mpirun, torchrun and horovodrun, side by side in one run.

For 1, 2 and 4 instances: a trivial program (``python -c pass``), and a program that starts
its launcher's collective backend (``popdist.init()`` under poprun and mpirun,
``init_process_group("gloo")`` + a barrier under torchrun, ``hvd.init()`` under horovodrun).
Wall time of the whole launch, rounds interleaved, medians with spread.

    .venv/bin/python benchmarks/launchers.py [--rounds 10] [--instances 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DOCS, MPIRUN_BASE, Summary, interleave, table, wall, which, write_doc

PY = sys.executable
TRIVIAL = "pass"
INIT_POPDIST = "import popdist; popdist.init()"
INIT_HOROVOD = "import horovod.torch as hvd; hvd.init()"
INIT_TORCH = (
    "import torch.distributed as d; d.init_process_group('gloo'); d.barrier(); "
    "d.destroy_process_group()"
)


def commands(n: int) -> dict[str, dict[str, list[str]]]:
    """{job: {launcher: argv}} for ``n`` instances."""
    poprun = [which("poprun"), "--num-instances", str(n), "--num-replicas", str(n)]
    mpirun = [*MPIRUN_BASE, "-np", str(n)]
    torchrun = [which("torchrun"), "--standalone", "--nproc-per-node", str(n)]
    horovodrun = [which("horovodrun"), "-np", str(n)]
    return {
        "trivial": {
            "poprun": [*poprun, PY, "-c", TRIVIAL],
            "mpirun": [*mpirun, PY, "-c", TRIVIAL],
            "torchrun": [*torchrun, "--no-python", PY, "-c", TRIVIAL],
            "horovodrun": [*horovodrun, PY, "-c", TRIVIAL],
        },
        "backend": {
            "poprun": [*poprun, PY, "-c", INIT_POPDIST],
            "mpirun": [*mpirun, PY, "-c", INIT_POPDIST],
            "torchrun": [*torchrun, "--no-python", PY, "-c", INIT_TORCH],
            "horovodrun": [*horovodrun, PY, "-c", INIT_HOROVOD],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--instances", default="1,2,4")
    args = parser.parse_args()
    counts = [int(x) for x in args.instances.split(",")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    results: dict[str, dict[str, dict[int, Summary]]] = {}
    for n in counts:
        for job, argvs in commands(n).items():
            cases = {name: (lambda a=argv: wall(a, env)) for name, argv in argvs.items()}
            for name in cases:  # warm the page cache once, untimed
                cases[name]()
            for name, summary in interleave(cases, args.rounds).items():
                results.setdefault(job, {}).setdefault(name, {})[n] = summary

    sections = []
    for job, title in (
        ("trivial", "`python -c pass`"),
        ("backend", "start the collective backend"),
    ):
        rows = []
        for name, by_n in results[job].items():
            rows.append([name, *(by_n[n].fmt() for n in counts)])
        sections.append(
            f"### {title}\n\n" + table(["launcher", *(f"{n} instances" for n in counts)], rows)
        )
        ratios = []
        for n in counts:
            pop = results[job]["poprun"][n].median
            ratios.append(
                f"{n}: poprun − mpirun = {pop - results[job]['mpirun'][n].median:+.3f} s, "
                f"poprun / mpirun = {pop / results[job]['mpirun'][n].median:.2f}×, "
                f"poprun / torchrun = {pop / results[job]['torchrun'][n].median:.2f}×, "
                f"poprun / horovodrun = {pop / results[job]['horovodrun'][n].median:.2f}×"
            )
        sections.append("\n".join(f"- {r}" for r in ratios))
    body = (
        f"Wall time of the whole launch, median of {args.rounds} interleaved rounds "
        "(IQR = interquartile range). `OMP_NUM_THREADS=1` for every launcher.\n\n"
        + "\n\n".join(sections)
    )
    path = write_doc("launchers.md", "Launch time: poprun, mpirun, torchrun, horovodrun", body)
    (DOCS / "launchers.json").write_text(
        json.dumps(
            {
                job: {name: {str(n): s.median for n, s in by_n.items()} for name, by_n in r.items()}
                for job, r in results.items()
            },
            indent=1,
        )
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
