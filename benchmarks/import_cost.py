"""What ``import popdist`` costs: a fresh interpreter importing it against one doing nothing.

Runs ``python -c pass`` and ``python -c "import popdist"`` (and, for scale, ``import
torch``) with the venv's interpreter, interleaved, and reports medians with their spread;
the target is at most 1.3× the bare start. Byte code is compiled once first and the
children run with byte-code writing allowed, as an installed package does. It also checks
that torch, horovod and numpy stay out of ``sys.modules`` after the import, and what the
PopTorch names' ``.pth`` line costs a start that does not ask for them (issue 54). Writes
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
from pathlib import Path

from _common import ROOT, interleave, save_results, table, wall, write_doc

TARGET = 1.3
POPDIST = "python -c 'import popdist'"
OPT_IN = "POPDIST_POPTORCH_MODULES=1 python -c pass"
#: setuptools' distutils-precedence.pth line, which every start of the venv runs: for scale.
SETUPTOOLS_LINE = (
    "import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os.environ.get(var, 'local') == "
    "'local'; enabled and __import__('_distutils_hack').add_shim(); "
)


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


def poptorch_hook() -> dict[str, object]:
    """The PopTorch names' ``.pth`` line (issue 54): where it is, what it costs a start that
    does not ask (the line run in-process, as ``site`` runs it, with the variable unset), and
    that such a start imports nothing for it and finds no ``poptorch``."""
    import sysconfig
    import timeit

    from _popdist_poptorch import PTH_LINE, PTH_NAME, VARIABLE

    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    saved = os.environ.pop(VARIABLE, None)
    try:
        number = 20_000

        def cost(line: str) -> float:  # compiled and run, as site runs a .pth's import line
            return min(timeit.repeat(lambda: exec(line, {}), number=number, repeat=5)) / number

        line_ns = cost(PTH_LINE) * 1e9
        setuptools_ns = cost(SETUPTOOLS_LINE) * 1e9
    finally:
        if saved is not None:
            os.environ[VARIABLE] = saved
    code = (
        "import sys, json, importlib.util; "
        "print(json.dumps(['_popdist_poptorch' in sys.modules, "
        "importlib.util.find_spec('poptorch') is not None]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(),
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    imported, found = json.loads(out)
    return {
        "pth": str(pth) if pth.is_file() else None,
        "line_ns": line_ns,
        "setuptools_line_ns": setuptools_ns,
        "hook_imported_off": imported,
        "poptorch_found_off": found,
    }


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
        OPT_IN: [py, "-c", "pass"],
    }
    if not args.no_torch:
        commands["python -c 'import torch' (scale)"] = [py, "-c", "import torch"]
    opted_in = {**environ, "POPDIST_POPTORCH_MODULES": "1"}

    envs = {name: opted_in if name == OPT_IN else environ for name in commands}
    for name, argv in commands.items():  # warm the page cache and write byte code
        wall(argv, envs[name])
    results = interleave(
        {name: (lambda a=argv, e=envs[name]: wall(a, e)) for name, argv in commands.items()},
        rounds,
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
    hook = poptorch_hook()
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
        f"\nThe PopTorch names' hook (issue 54, `{hook['pth'] or 'popdist-poptorch-modules.pth: not installed'}`): "
        f"its line costs a start that does not ask {hook['line_ns'] / 1e3:.1f} µs (compiled and "
        f"run in-process as `site` runs it, the variable unset; setuptools' "
        f"distutils-precedence.pth line, which every start runs too, {hook['setuptools_line_ns'] / 1e3:.1f} µs; "
        f"a bare start is {bare * 1e3:.1f} ms, its IQR {results['python -c pass'].iqr * 1e3:.1f} ms), and such a "
        f"start imports {'its module (a regression)' if hook['hook_imported_off'] else 'nothing for it'}"
        f" and finds {'a poptorch (a regression)' if hook['poptorch_found_off'] else 'no poptorch'}. "
        f"`{OPT_IN}` (the finder installed, nothing imported until a PopTorch name is) costs "
        f"{results[OPT_IN].median / bare:.2f}× a bare start.\n"
    )
    print(body)
    path = write_doc("import-cost.md", "Import cost of popdist", body)
    save_results(
        "import-cost",
        {
            "ratio": ratio,
            "heavy": heavy,
            "poptorch_hook": hook,
            "importtime_ms": inproc,
            "median_s": {name: s.median for name, s in results.items()},
            "samples": {name: s.samples for name, s in results.items()},
        },
    )
    print(f"wrote {path.relative_to(ROOT)}")
    regressed = hook["hook_imported_off"] or hook["poptorch_found_off"]
    return 0 if ratio <= TARGET and not heavy and not regressed else 1


if __name__ == "__main__":
    sys.exit(main())
