"""Output throughput of poprun against bare mpirun: a 50 MB flood and a 50 MB single line.

One instance writes ``--mb`` MB to its stdout in 64 KiB writes, either as 100-byte lines
(the flood) or as one line with no newline until the end; the launcher's stdout is a pipe
this script reads and counts (so every byte is checked to arrive). Each round runs bare
``mpirun -np 1`` (as users run it), ``mpirun --tag-output`` (the framing poprun undoes for
instances on other hosts; local ones write to poprun through FIFOs) and ``poprun``, in a rotating order; throughput is bytes over the time from the first byte to
the end of output (wall time, launch included, is reported beside it). The goal (issue 18)
is poprun ≥ 0.8× bare mpirun's throughput in both shapes. Writes docs/output-throughput.md
and .json.

    .venv/bin/python benchmarks/output_throughput.py [--rounds 5] [--mb 50]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import MPIRUN_BASE, ROOT, Summary, save_results, table, which, write_doc

PY = sys.executable
TARGET = 0.8
#: The writer: ``shape`` is "flood" or "line"; writes ``mb`` MB in 64 KiB writes.
WRITER = """
import os, sys
shape, total = sys.argv[1], int(sys.argv[2]) * 1_000_000
block = (b"x" * 99 + b"\\n") * 655 if shape == "flood" else b"x" * 65_500
written = 0
while written < total:
    piece = block[: total - written]
    if shape == "line" and written + len(piece) >= total:
        piece = piece[:-1] + b"\\n"
    while piece:
        n = os.write(1, piece)
        piece = piece[n:]
        written += n
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "OMPI_", "PMIX_"))}


def run_once(argv: list[str], expect: int) -> tuple[float, float, float]:
    """(Wall s, s from the first byte to the end of output, CPU s of the process tree).

    Its stdout is a pipe read here; the byte count is checked. The CPU time (user + system
    of the launcher, mpirun and the writer) depends far less on the machine's load than the
    times do.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(), cwd=ROOT
    )
    assert proc.stdout is not None
    got = 0
    first = None
    while chunk := proc.stdout.read1(1 << 20):
        if first is None:
            first = time.perf_counter()
        got += len(chunk)
    ended = time.perf_counter()
    code = proc.wait()
    took = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if code != 0 or got < expect or first is None:
        raise RuntimeError(f"{argv[0]} exited {code} after {got} of {expect} bytes")
    return took, ended - first, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--mb", type=int, default=50)
    args = parser.parse_args()
    poprun = which("poprun")
    expect = args.mb * 1_000_000
    results: dict[str, Any] = {}
    rows = []
    met = True
    for shape in ("flood", "line"):
        prog = [PY, "-c", WRITER, shape, str(args.mb)]
        cases = {
            "mpirun": [*MPIRUN_BASE, "-np", "1", *prog],
            "mpirun --tag-output": [*MPIRUN_BASE, "--tag-output", "-np", "1", *prog],
            "poprun": [poprun, "--num-instances", "1", "--num-replicas", "1", *prog],
        }
        for argv in cases.values():  # warm-up: page cache, Open MPI's first start
            run_once(argv, expect)
        walls: dict[str, list[float]] = {name: [] for name in cases}
        streams: dict[str, list[float]] = {name: [] for name in cases}
        cpus: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        for r in range(args.rounds):  # every case once per round, in a rotating order
            for name in names[r % len(names) :] + names[: r % len(names)]:
                took, streamed, cpu = run_once(cases[name], expect)
                walls[name].append(took)
                streams[name].append(streamed)
                cpus[name].append(cpu)
        ratio = statistics.median(
            b / p for b, p in zip(streams["mpirun"], streams["poprun"], strict=True)
        )
        wall_ratio = statistics.median(
            b / p for b, p in zip(walls["mpirun"], walls["poprun"], strict=True)
        )
        met = met and ratio >= TARGET
        results[shape] = {"wall_s": walls, "stream_s": streams, "cpu_s": cpus, "ratio": ratio,
                          "wall_ratio": wall_ratio}  # fmt: skip
        for name in names:
            stream, wall = Summary(tuple(streams[name])), Summary(tuple(walls[name]))
            cpu = statistics.median(cpus[name])
            rows.append([shape, name, f"{args.mb / stream.median:.0f} MB/s",
                         stream.fmt(), wall.fmt(), f"{cpu:.2f} s"])  # fmt: skip
        cpu_ratio = statistics.median(cpus["poprun"]) / statistics.median(cpus["mpirun"])
        rows.append([shape, "**poprun / bare mpirun**", f"**{ratio:.2f}×**",
                     "met" if ratio >= TARGET else "**not met**", f"{wall_ratio:.2f}× (launch included)",
                     f"{cpu_ratio:.2f}× bare mpirun's"])  # fmt: skip
        print(rows[-4:], flush=True)
    body = (
        f"One instance writes {args.mb} MB to stdout in 64 KiB writes: a *flood* of 100-byte "
        "lines, or one *line* with its only newline at the end. The launcher's stdout is a pipe "
        "read by the benchmark, which checks the byte count. *Throughput* is the MB over the "
        "time from the first byte read to the end of output (the launch is a separate goal, in "
        "the launch benchmarks); the wall time of the whole command is beside it, and the CPU time "
        "(user + system) of the launcher's process tree, which depends far less on the "
        "machine's load (poprun's tree against bare mpirun's: poprun, mpirun, the writer). "
        f"{args.rounds} rounds after a warm-up, the cases in a rotating order; ratios are "
        "medians of the per-round ratios (bare mpirun's time / poprun's). Bare mpirun runs "
        "as users run it; `mpirun --tag-output` is the framing poprun undoes for instances on "
        "other hosts (instances on poprun's host write to it through FIFOs, not through mpirun). "
        f"Goal (issue 18): poprun ≥ {TARGET}× bare mpirun in both shapes.\n\n"
        + table(
            [
                "shape",
                "launcher",
                "throughput",
                "first byte → end",
                "wall time",
                "CPU (process tree)",
            ],
            rows,
        )
    )
    write_doc("output-throughput.md", "Output throughput: poprun against bare mpirun", body)
    save_results(
        "output-throughput",
        {"mb": args.mb, "rounds": args.rounds, "target": TARGET, "met": met, **results},
    )
    print(body)


if __name__ == "__main__":
    main()
