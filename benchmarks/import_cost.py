"""What ``import popdist`` costs: a fresh interpreter importing it against one doing nothing.

Runs ``python -c pass`` and ``python -c "import popdist"`` (and, for scale, ``import
torch``) with the venv's interpreter, interleaved, and reports medians with their spread;
the target is at most 1.3× the bare start. Byte code is compiled once first and the
children run with byte-code writing allowed, as an installed package does. It also checks
that torch, horovod and numpy stay out of ``sys.modules`` after the import. Writes
docs/import-cost.md.

    .venv/bin/python benchmarks/import_cost.py [--rounds 30] [--no-torch]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from _common import ROOT, interleave, save_results, table, wall, write_doc

TARGET = 1.3
POPDIST = "python -c 'import popdist'"


def _env() -> dict[str, str]:
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("POPDIST_", "OMPI_", "PMIX_", "HOROVOD_"))
    }
    environ.pop("PYTHONDONTWRITEBYTECODE", None)  # measure the import, not the compiler
    return environ


def heavy_modules_after_import() -> list[str]:
    """Top-level heavy packages in ``sys.modules`` after ``import popdist`` (should be none)."""
    code = (
        "import sys, json, popdist; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'torch', 'horovod', 'numpy', 'mpi4py'})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return list(json.loads(out))


def importtime_us(rounds: int) -> list[int]:
    """Cumulative microseconds of ``import popdist`` as ``python -X importtime`` reports it."""
    got = []
    for _ in range(rounds):
        err = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", "import popdist"],
            env=_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        line = next(ln for ln in err.splitlines() if ln.rstrip().endswith("| popdist"))
        got.append(int(line.split("|")[1]))
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (>= 10)")
    parser.add_argument("--no-torch", action="store_true", help="skip the `import torch` row")
    args = parser.parse_args()
    rounds = max(args.rounds, 10)
    py, environ = sys.executable, _env()
    commands = {
        "python -c pass": [py, "-c", "pass"],
        POPDIST: [py, "-c", "import popdist"],
    }
    if not args.no_torch:
        commands["python -c 'import torch' (scale)"] = [py, "-c", "import torch"]
    for argv in commands.values():  # warm the page cache and write byte code
        wall(argv, environ)
    results = interleave(
        {name: (lambda a=argv: wall(a, environ)) for name, argv in commands.items()}, rounds
    )
    bare = results["python -c pass"].median
    fastest = min(results["python -c pass"].samples)
    rows = [
        [
            f"`{name}`",
            s.fmt(1e3, "ms", 1),
            f"{s.median / bare:.2f}×",
            f"{min(s.samples) * 1e3:.1f} ms",
            f"{min(s.samples) / fastest:.2f}×",
        ]
        for name, s in results.items()
    ]
    ratio = results[POPDIST].median / bare
    heavy = heavy_modules_after_import()
    inproc = statistics.median(importtime_us(rounds)) / 1e3
    verdict = "met" if ratio <= TARGET else "NOT met"
    body = (
        f"{rounds} interleaved rounds, medians (interquartile range), wall time of a fresh "
        f"interpreter ({py}).\n\n"
        + table(["command", "median wall time", "vs bare", "fastest", "vs bare"], rows)
        + f"\n\n`import popdist` costs {ratio:.2f}× a bare start: the {TARGET}× target is "
        f"{verdict} (medians; the fastest runs, least disturbed by other load, give "
        f"{min(results[POPDIST].samples) / fastest:.2f}×). Inside the interpreter (`-X importtime`, median) the import itself takes "
        f"{inproc:.2f} ms.\nHeavy modules in `sys.modules` after `import popdist`: "
        f"{', '.join(heavy) if heavy else 'none (torch, horovod, numpy and mpi4py stay out)'}.\n"
    )
    print(body)
    path = write_doc("import-cost.md", "Import cost of popdist", body)
    save_results(
        "import-cost",
        {
            "ratio": ratio,
            "heavy": heavy,
            "importtime_ms": inproc,
            "median_s": {name: s.median for name, s in results.items()},
            "samples": {name: s.samples for name, s in results.items()},
        },
    )
    print(f"wrote {path.relative_to(ROOT)}")
    return 0 if ratio <= TARGET and not heavy else 1


if __name__ == "__main__":
    sys.exit(main())
