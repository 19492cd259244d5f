"""Launch overhead of poprun against bare mpirun with equivalent flags (interleaved runs).

Rows: a trivial job (``python -c "import popdist"``), a job whose instances start Horovod
(``popdist.init()`` when it exists, else ``hvd.init()``), ``import popdist`` against
``python -c pass``, ``poprun --help``, and how long a job takes to end after Ctrl-C (SIGINT
to the launcher once both instances are running; poprun forwards it and ends the job).
Prints a table and writes docs/launch-overhead.md.

    .venv/bin/python benchmarks/launch_overhead.py [--repeats 11]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
POPRUN = str(Path(PY).parent / "poprun")
sys.path.insert(0, str(ROOT))
from poprun.plan.mpirun import ALLREDUCE_MCA, SINGLE_HOST_MCA  # noqa: E402

sys.path.insert(1, str(ROOT / "benchmarks"))
from _common import rounds_until_clear  # noqa: E402
from goals import clears  # noqa: E402

MPIRUN_FLAGS = (
    ["--tag-output", "--bind-to", "none", "--allow-run-as-root"]
    if os.geteuid() == 0
    else ["--tag-output", "--bind-to", "none"]
) + [arg for name, value in (*SINGLE_HOST_MCA, *ALLREDUCE_MCA) for arg in ("--mca", name, value)]


def _time(cmd: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    return time.perf_counter() - began


def interleaved(
    pairs: dict[str, list[str]], repeats: int, max_repeats: int = 0, budget_s: float = 0.0
) -> dict[str, list[float]]:
    """Run every command once per round, in the same order, ``repeats`` rounds (after one
    warm-up); then more, up to ``max_repeats`` within ``budget_s``, until the goals on poprun
    against mpirun clear with margin (issue 33)."""
    for cmd in pairs.values():
        _time(cmd)
    out: dict[str, list[float]] = {name: [] for name in pairs}

    def one_round(_: int) -> None:
        for name, cmd in pairs.items():
            out[name].append(_time(cmd))

    def settled() -> bool:
        def each(a: str, b: str, ratio: bool) -> list[float]:
            pairs_ = zip(out.get(a, []), out.get(b, []), strict=True)
            return [x / y if ratio else x - y for x, y in pairs_]

        trivial = each("trivial: poprun 2 instances", "trivial: mpirun -np 2", ratio=False)
        horovod = each("Horovod: poprun 2 instances", "Horovod: mpirun -np 2", ratio=True)
        return clears(trivial, 0.12, "≤") and (not horovod or clears(horovod, 1.1, "≤"))

    rounds_until_clear(
        one_round, repeats, settled=settled, max_rounds=max_repeats, budget_s=budget_s
    )
    return out


SLEEPER = ["sh", "-c", "echo up; exec sleep 60"]


def _time_sigint(cmd: list[str]) -> float:
    """Seconds from SIGINT to the launcher's exit, once both instances said they are up."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        start_new_session=True,  # Ctrl-C for this job only
    )
    assert proc.stdout is not None
    up = 0
    for line in proc.stdout:
        up += "up" in line
        if up == 2:
            break
    began = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: nothing else
        proc.stdout.close()
        proc.wait()
    return time.perf_counter() - began


def sigint_rounds(pairs: dict[str, list[str]], repeats: int) -> dict[str, list[float]]:
    """:func:`_time_sigint` of every command once per round, ``repeats`` rounds."""
    out: dict[str, list[float]] = {name: [] for name in pairs}
    for _ in range(repeats):
        for name, cmd in pairs.items():
            out[name].append(_time_sigint(cmd))
    return out


def _row(name: str, values: list[float]) -> str:
    med = statistics.median(values)
    return (
        f"| {name} | {med * 1000:.0f} ms | {min(values) * 1000:.0f}–{max(values) * 1000:.0f} ms |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--max-repeats", type=int, default=21, help="more rounds until margin")
    args = parser.parse_args()

    import popdist

    init = (
        "import popdist; popdist.init()"
        if hasattr(popdist, "init")
        else "import horovod.torch as hvd; hvd.init()"
    )
    init_note = (
        "popdist.init()"
        if hasattr(popdist, "init")
        else "hvd.init() (popdist.init() does not exist yet)"
    )
    try:
        import horovod.torch  # noqa: F401

        have_hvd = True
    except ImportError:
        have_hvd = False

    env_np2 = ["-np", "2", "-x", "PYTHONUNBUFFERED=1"]
    rows: list[tuple[str, list[str]]] = [
        ("trivial: mpirun -np 2", ["mpirun", *MPIRUN_FLAGS, *env_np2, PY, "-c", "import popdist"]),
        (
            "trivial: poprun 2 instances",
            [POPRUN, "--num-instances", "2", "--num-replicas", "2", PY, "-c", "import popdist"],
        ),
    ]
    if have_hvd:
        rows += [
            ("Horovod: mpirun -np 2", ["mpirun", *MPIRUN_FLAGS, *env_np2, PY, "-c", init]),
            (
                "Horovod: poprun 2 instances",
                [POPRUN, "--num-instances", "2", "--num-replicas", "2", PY, "-c", init],
            ),
        ]
    rows += [
        ("python -c pass", [PY, "-c", "pass"]),
        ("python -c 'import popdist'", [PY, "-c", "import popdist"]),
        ("poprun --help", [POPRUN, "--help"]),
    ]
    times = interleaved(dict(rows), args.repeats, args.max_repeats, budget_s=75)
    times.update(
        sigint_rounds(
            {
                "Ctrl-C to exit: mpirun -np 2": ["mpirun", *MPIRUN_FLAGS, *env_np2, *SLEEPER],
                "Ctrl-C to exit: poprun 2 instances": [
                    *(POPRUN, "--num-instances", "2", "--num-replicas", "2", *SLEEPER)
                ],
            },
            args.repeats,
        )
    )
    med = {name: statistics.median(v) for name, v in times.items()}
    lines = [
        "# Launch overhead",
        "",
        f"`benchmarks/launch_overhead.py --repeats {args.repeats}`: every command once per round, rounds interleaved, "
        f"after one warm-up round; wall time of the whole command; {os.cpu_count()} CPUs; "
        f"bare mpirun gets poprun's flags (`{' '.join(MPIRUN_FLAGS)} -x PYTHONUNBUFFERED=1`). Horovod rows: {init_note}.",
        "",
        "| command | median | min–max |",
        "|---|---|---|",
        *(_row(name, v) for name, v in times.items()),
        "",
        "| check | result | target |",
        "|---|---|---|",
        f"| poprun − mpirun, trivial job | {(med['trivial: poprun 2 instances'] - med['trivial: mpirun -np 2']) * 1000:+.0f} ms | ≤ +120 ms |",
    ]
    if have_hvd:
        ratio = med["Horovod: poprun 2 instances"] / med["Horovod: mpirun -np 2"]
        lines.append(f"| poprun / mpirun, Horovod job | {ratio:.2f}× | ≤ 1.1× |")
    else:
        lines.append(
            "| poprun / mpirun, Horovod job | skipped: horovod.torch not importable | ≤ 1.1× |"
        )
    import_ratio = med["python -c 'import popdist'"] / med["python -c pass"]
    lines += [
        f"| import popdist / python -c pass | {import_ratio:.2f}× | ≤ 1.3× |",
        f"| poprun --help | {med['poprun --help'] * 1000:.0f} ms | < 300 ms |",
        f"| Ctrl-C to exit, poprun (mpirun: {med['Ctrl-C to exit: mpirun -np 2'] * 1000:.0f} ms) "
        f"| {med['Ctrl-C to exit: poprun 2 instances'] * 1000:.0f} ms | < 3000 ms |",
        "",
    ]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _common import machine, save_results

    lines.insert(2, f"Machine: {machine()}.")
    lines.insert(3, "")
    text = "\n".join(lines)
    print(text)
    (ROOT / "docs" / "launch-overhead.md").write_text(text)
    summary = {
        name: {"median": med[name], "min": min(v), "max": max(v), "samples": v}
        for name, v in times.items()
    }
    save_results("launch-overhead", summary)


if __name__ == "__main__":
    main()
