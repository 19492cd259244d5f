"""Shared helpers of the benchmarks: interleaved timing, medians with spread, the machine, tables."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
VENV_BIN = Path(sys.executable).parent
MPIRUN_BASE = ["mpirun", "--oversubscribe", "--bind-to", "none"] + (
    ["--allow-run-as-root"] if os.geteuid() == 0 else []
)


PACKAGES = ("poprun", "popdist", "popdist_torch", "popdist_lightning", "_popdist_poptorch")


def compile_sources(root: Path = ROOT) -> None:
    """Write the bytecode of the project's packages under ``root``, as ``pip install`` does.

    An editable install compiles nothing, and where ``PYTHONDONTWRITEBYTECODE`` is set (as
    on this machine) no run ever writes it: every launch would then compile poprun from
    source (about 60 ms on 2 cores) while the anchors' Python (torchrun, horovodrun) runs
    from site-packages' bytecode. Up-to-date files are left alone (a fraction of a second).
    """
    import compileall

    for name in PACKAGES:
        if (root / name).is_dir():
            compileall.compile_dir(root / name, quiet=1)


compile_sources()  # every benchmark measures the project as installed, not its compiler


@dataclass(frozen=True)
class Summary:
    """Median and spread (min, max, interquartile range) of repeated measurements."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def iqr(self) -> float:
        if len(self.samples) < 4:
            return max(self.samples) - min(self.samples)
        q = statistics.quantiles(self.samples, n=4)
        return q[2] - q[0]

    def fmt(self, scale: float = 1.0, unit: str = "s", digits: int = 3) -> str:
        return f"{self.median * scale:.{digits}f} {unit} (IQR {self.iqr * scale:.{digits}f}, n={len(self.samples)})"


def interleave(
    cases: dict[str, Callable[[], float]],
    rounds: int,
    *,
    until: Callable[[dict[str, list[float]]], bool] | None = None,
    max_rounds: int = 0,
    budget_s: float = 0.0,
    at_least: int | None = None,
) -> dict[str, Summary]:
    """Run every case once per round, in a rotating order, so drift hits all cases alike.

    With ``until`` (the samples so far → whether the goals clear with margin), more rounds
    follow the ``rounds`` asked for, up to ``max_rounds`` within ``budget_s``; with
    ``at_least``, rounds past that many run only within ``budget_s``
    (:func:`rounds_until_clear`)."""
    names = list(cases)
    got: dict[str, list[float]] = {name: [] for name in names}

    def one_round(r: int) -> None:
        for name in names[r % len(names) :] + names[: r % len(names)]:
            got[name].append(cases[name]())

    settled = (lambda: until(got)) if until is not None else (lambda: True)
    rounds_until_clear(
        one_round, rounds, settled=settled, max_rounds=max_rounds, budget_s=budget_s,
        at_least=at_least,
    )  # fmt: skip
    return {name: Summary(tuple(v)) for name, v in got.items()}


def wall(argv: Sequence[str], env: dict[str, str] | None = None) -> float:
    """Wall time of one command, which must succeed."""
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}"
        )
    return elapsed


def cpu_model(cpuinfo: str | None = None) -> str:
    """This machine's CPU as the per-CPU records key it: /proc/cpuinfo's model name, with its
    family and model numbers when the name carries no part number.

    A hypervisor may mask the name to a bare "AMD EPYC" or "Intel(R) Xeon(R) Processor", which
    several generations share (two EPYCs of this project's kind, one about 1.7 times slower in
    Python, both read "AMD EPYC"); the family and model still tell them apart.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():  # the first CPU's block
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or "?"
    if not any(c.isdigit() for c in name) and fields.get("cpu family") and fields.get("model"):
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


#: The key of the records written before they were kept per CPU, and of every run until the
#: key named the family and model (:func:`cpu_model`): two machines of this name.
LEGACY_CPU = "AMD EPYC"


def _records(stem: str) -> dict[str, Any]:
    """``docs/<stem>.json`` in its per-CPU form: ``{"latest", "by_cpu", "notes"}``.

    A file from before the per-CPU form (one run's results at the top) is read as the
    record of :data:`LEGACY_CPU`.
    """
    path = DOCS / f"{stem}.json"
    if not path.exists():
        return {"latest": None, "by_cpu": {}, "notes": {}}
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "by_cpu" in data:
        data.setdefault("notes", {})
        return data
    return {"latest": LEGACY_CPU, "by_cpu": {LEGACY_CPU: data}, "notes": {}}


def save_results(stem: str, data: Any, cpu: str | None = None) -> Path:
    """Write one run's ``data`` as this CPU's record in ``docs/<stem>.json``.

    The other CPUs' records stay: a regression on one CPU stays visible after a run on
    another. The run's CPU becomes ``latest`` (the record the report's headline reads).
    """
    records = _records(stem)
    cpu = cpu or cpu_model()
    records["by_cpu"][cpu] = data
    records["latest"] = cpu
    records["notes"].pop(cpu, None)  # a measured record replaces a transcribed one
    path = DOCS / f"{stem}.json"
    DOCS.mkdir(exist_ok=True)
    path.write_text(json.dumps(records, indent=1))
    return path


def load_results(stem: str, cpu: str | None = None) -> Any:
    """The record of ``cpu`` (default: the latest run's) in ``docs/<stem>.json``, or None."""
    records = _records(stem)
    return records["by_cpu"].get(cpu or records["latest"])


def latest_cpu(stem: str) -> str | None:
    """The key of the latest run's record in ``docs/<stem>.json`` (None: no record)."""
    latest: str | None = _records(stem)["latest"]
    return latest


def recorded_cpus(stem: str) -> dict[str, str]:
    """CPU model → its note ("" when measured; else how the figures were recorded)."""
    records = _records(stem)
    return {cpu: records["notes"].get(cpu, "") for cpu in records["by_cpu"]}


def machine() -> str:
    """One line describing this machine and its load."""
    cpu = cpu_model()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    mpi = subprocess.run(
        ["mpirun", "--version"], capture_output=True, text=True
    ).stdout.splitlines()
    return (
        f"{os.cpu_count()} × {cpu}, {mem:.0f} GiB, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, {mpi[0] if mpi else 'no mpirun'}, load average {load}"
    )


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def write_doc(name: str, title: str, body: str) -> Path:
    """Write ``docs/<name>`` with a title, the machine line and ``body``."""
    DOCS.mkdir(exist_ok=True)
    path = DOCS / name
    script = Path(sys.argv[0]).resolve()
    args, skip = [], False
    for arg in sys.argv[1:]:  # run_all's --baseline points at a temporary export: not to repeat
        if skip or arg == "--baseline":
            skip = not skip
            continue
        args.append(arg)
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    cmd = " ".join([shown.as_posix(), *args])
    path.write_text(
        f"# {title}\n\nMachine: {machine()}.\nRegenerate: `.venv/bin/python {cmd}`.\n\n{body}\n"
    )
    return path


def which(name: str) -> str:
    """The path of a tool in the venv, else on PATH."""
    cand = VENV_BIN / name
    if cand.exists():
        return str(cand)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found; run `make setup`")
    return found


def round_ratios(on: Sequence[float], off: Sequence[float], per_round: int) -> list[float]:
    """A/B blocks in pairs (``on[k]``, ``off[k]``) grouped into rounds of ``per_round``
    consecutive pairs: each round's mean on over its mean off (a trailing partial round is left
    out). Rounds of several short pairs cancel a slow drift as the pairs do, and their spread
    is the one a goal's margin is judged against (issue 33)."""
    whole = min(len(on), len(off)) // per_round * per_round
    return [
        statistics.fmean(on[k : k + per_round]) / statistics.fmean(off[k : k + per_round])
        for k in range(0, whole, per_round)
    ]


#: The share of a half-round's steps :func:`trimmed_mean` leaves out at each end.
TRIM = 0.05


def trimmed_mean(values: Sequence[float], cut: float = TRIM) -> float:
    """The mean of ``values`` without the ``cut`` share of the lowest and of the highest.

    A step's time on a shared 2-core machine has a long tail (the 99th percentile twice the
    median, now and then a step of 20–100 ms) that lands in either half of an A/B round by
    chance and sets most of the spread of its mean; a cost paid on every step moves the
    trimmed mean by as much as the mean. Raises ``ValueError`` on no values."""
    if not values:
        raise ValueError("trimmed_mean of no values")
    ordered = sorted(values)
    k = int(len(ordered) * cut)
    kept = ordered[k : len(ordered) - k] or ordered
    return sum(kept) / len(kept)


def charged_ratios(
    on_s: Sequence[float], off_s: Sequence[float], share: Sequence[float]
) -> list[float]:
    """Rounds of an A/B whose halves ran the same number of steps: ``on_s[k]``/``off_s[k]``
    the seconds round k's steps took with the feature on and off, ``share[k]`` the part of
    the round a thread of the feature ran in both halves took (its CPU time over the round's
    wall time). Each round's throughput on over off, that thread's cost charged to *on*."""
    return [off / on * (1 - part) for on, off, part in zip(on_s, off_s, share, strict=True)]


def rounds_until_clear(
    one_round: Callable[[int], None],
    rounds: int,
    *,
    settled: Callable[[], bool],
    max_rounds: int,
    budget_s: float,
    at_least: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run ``one_round(r)`` for r = 0, 1, ...: ``rounds`` of them, then more while
    ``settled()`` is false (the goals do not yet clear with margin: issue 33), as long as
    another round fits in ``budget_s`` (judged by the slowest round so far) and ``max_rounds``
    is not reached. With ``at_least``, only that many rounds run whatever the budget, and the
    rest of the ``rounds`` asked for run only while they fit in it too: on a slower machine a
    benchmark then takes fewer rounds, not longer than its limit. Returns the rounds run."""
    start = clock()
    slowest = 0.0
    done = 0
    floor = rounds if at_least is None else min(at_least, rounds)
    while done < rounds or (done < max_rounds and not settled()):
        if done >= floor and clock() - start + slowest > budget_s:
            break
        t0 = clock()
        one_round(done)
        slowest = max(slowest, clock() - t0)
        done += 1
    return done
