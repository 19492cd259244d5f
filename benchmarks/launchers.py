"""Launch time of poprun, mpirun, torchrun and horovodrun, side by side in one run.

For 1, 2 and 4 instances: a trivial program (``python -c pass``), and a program that starts
its launcher's collective backend (``popdist.init()`` under poprun and mpirun,
``init_process_group("gloo")`` + a barrier under torchrun, ``hvd.init()`` under horovodrun).
Wall time of the whole launch, rounds interleaved, medians with spread. ``mpirun`` is bare
mpirun with Open MPI's defaults; ``mpirun + poprun MCA`` adds the shared-memory selection and
the allreduce rules poprun passes on one host, so the two rows show what that tuning is worth
by itself. With ``--baseline DIR`` (a copy of the packages at an earlier commit, put first on
PYTHONPATH) a ``poprun (before)`` row runs that version in the same interleaved rounds.

    .venv/bin/python benchmarks/launchers.py [--rounds 10] [--instances 1,2,4] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from _common import (
    DOCS,
    MPIRUN_BASE,
    Summary,
    interleave,
    save_results,
    table,
    wall,
    which,
    write_doc,
)
from goals import clears

PY = sys.executable
TRIVIAL = "pass"
INIT_POPDIST = "import popdist; popdist.init()"
INIT_HOROVOD = "import horovod.torch as hvd; hvd.init()"
INIT_TORCH = (
    "import torch.distributed as d; d.init_process_group('gloo'); d.barrier(); "
    "d.destroy_process_group()"
)


#: job -> (most rounds, seconds for all of one count's rounds): more rounds than ``--rounds``
#: until poprun's goals against bare mpirun (and torchrun) clear with margin (issue 33). A
#: trivial round takes a few seconds (torchrun's is the longest); a backend round 15-20 s.
MORE_ROUNDS = {"trivial": (16, 60.0), "backend": (6, 100.0)}


def _settled(job: str) -> Callable[[dict[str, list[float]]], bool]:
    """Whether the per-round samples so far meet ``job``'s goals with margin."""

    def settled(got: dict[str, list[float]]) -> bool:
        pop, bare = got["poprun"], got["mpirun"]
        if job == "trivial":
            return clears([a - b for a, b in zip(pop, bare, strict=True)], 0.12, "≤")
        peer = got["torchrun"]
        return clears([a / b for a, b in zip(pop, bare, strict=True)], 1.1, "≤") and clears(
            [a / b for a, b in zip(pop, peer, strict=True)], 1.0, "<"
        )

    return settled


def commands(n: int, baseline: bool = False) -> dict[str, dict[str, list[str]]]:
    """{job: {launcher: argv}} for ``n`` instances."""
    from poprun.plan.mpirun import ALLREDUCE_MCA, SINGLE_HOST_MCA

    poprun = [which("poprun"), "--num-instances", str(n), "--num-replicas", str(n)]
    mpirun = [*MPIRUN_BASE, "-np", str(n)]
    mca = [
        arg for name, value in (*SINGLE_HOST_MCA, *ALLREDUCE_MCA) for arg in ("--mca", name, value)
    ]
    torchrun = [which("torchrun"), "--standalone", "--nproc-per-node", str(n)]
    horovodrun = [which("horovodrun"), "-np", str(n)]
    jobs = {
        "trivial": {
            "poprun": [*poprun, PY, "-c", TRIVIAL],
            "mpirun": [*mpirun, PY, "-c", TRIVIAL],
            "mpirun + poprun MCA": [*mpirun, *mca, PY, "-c", TRIVIAL],
            "torchrun": [*torchrun, "--no-python", PY, "-c", TRIVIAL],
            "horovodrun": [*horovodrun, PY, "-c", TRIVIAL],
        },
        "backend": {
            "poprun": [*poprun, PY, "-c", INIT_POPDIST],
            "mpirun": [*mpirun, PY, "-c", INIT_POPDIST],
            "mpirun + poprun MCA": [*mpirun, *mca, PY, "-c", INIT_POPDIST],
            "torchrun": [*torchrun, "--no-python", PY, "-c", INIT_TORCH],
            "horovodrun": [*horovodrun, PY, "-c", INIT_HOROVOD],
        },
    }
    if baseline:
        jobs["trivial"]["poprun (before)"] = jobs["trivial"]["poprun"]
        jobs["backend"]["poprun (before)"] = jobs["backend"]["poprun"]
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--instances", default="1,2,4")
    parser.add_argument("--baseline", help="packages of an earlier commit, for a before row")
    args = parser.parse_args()
    counts = [int(x) for x in args.instances.split(",")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before_env = {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, [args.baseline, env.get("PYTHONPATH")])),
    }

    results: dict[str, dict[str, dict[int, Summary]]] = {}
    for n in counts:
        for job, argvs in commands(n, bool(args.baseline)).items():
            cases = {
                name: (lambda a=argv, e=(before_env if "before" in name else env): wall(a, e))
                for name, argv in argvs.items()
            }
            for name in cases:  # warm the page cache once, untimed
                cases[name]()
            more = MORE_ROUNDS[job]
            got = interleave(
                cases, args.rounds, until=_settled(job), max_rounds=more[0], budget_s=more[1]
            )
            for name, summary in got.items():
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
            if "poprun (before)" in results[job]:
                before = results[job]["poprun (before)"][n].median
                ratios.append(
                    f"{n}: poprun before tuning {before:.3f} s → after {results[job]['poprun'][n].median:.3f} s"
                )
            pop = results[job]["poprun"][n].median
            ratios.append(
                f"{n}: poprun − mpirun = {pop - results[job]['mpirun'][n].median:+.3f} s, "
                f"poprun / mpirun = {pop / results[job]['mpirun'][n].median:.2f}×, "
                f"poprun / torchrun = {pop / results[job]['torchrun'][n].median:.2f}×, "
                f"poprun / horovodrun = {pop / results[job]['horovodrun'][n].median:.2f}×"
            )
        sections.append("\n".join(f"- {r}" for r in ratios))
    body = (
        f"Wall time of the whole launch, median of at least {args.rounds} interleaved rounds "
        f"(more, up to {MORE_ROUNDS['trivial'][0]} for `python -c pass` and "
        f"{MORE_ROUNDS['backend'][0]} for the backend, until poprun's goals clear with margin: "
        f"{_rounds_run(results)}; IQR = interquartile range). `OMP_NUM_THREADS=1` for every "
        "launcher.\n\n" + "\n\n".join(sections)
    )
    path = write_doc("launchers.md", "Launch time: poprun, mpirun, torchrun, horovodrun", body)
    save_results(
        "launchers",
        {
            job: {
                name: {
                    str(n): {"median": s.median, "iqr": s.iqr, "samples": s.samples}
                    for n, s in by_n.items()
                }
                for name, by_n in r.items()
            }
            for job, r in results.items()
        },
    )
    _plot(results, counts)
    print(path.read_text())


def _rounds_run(results: dict[str, dict[str, dict[int, Summary]]]) -> str:
    """How many rounds each job ran for each instance count."""
    return "; ".join(
        f"{job} "
        + ", ".join(f"{len(s.samples)} for {n}" for n, s in results[job]["poprun"].items())
        for job in results
    )


def _plot(results: dict[str, dict[str, dict[int, Summary]]], counts: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (job, title) in zip(
        axes, (("trivial", "python -c pass"), ("backend", "start the backend")), strict=True
    ):
        names = list(results[job])
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            xs = [c + (i - (len(names) - 1) / 2) * width for c in range(len(counts))]
            meds = [results[job][name][n].median for n in counts]
            errs = [results[job][name][n].iqr / 2 for n in counts]
            ax.bar(xs, meds, width=width, yerr=errs, label=name, capsize=2)
        ax.set_xticks(range(len(counts)), [f"{n} instances" for n in counts])
        ax.set_ylabel("wall time (s)")
        ax.set_title(f"Launch: {title}")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "launchers.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
