"""Shared helpers of the benchmarks: interleaved timing, medians with spread, the machine, tables."""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
VENV_BIN = Path(sys.executable).parent
MPIRUN_BASE = ["mpirun", "--oversubscribe", "--bind-to", "none"] + (
    ["--allow-run-as-root"] if os.geteuid() == 0 else []
)


PACKAGES = ("poprun", "popdist", "popdist_torch", "popdist_lightning")


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


def interleave(cases: dict[str, Callable[[], float]], rounds: int) -> dict[str, Summary]:
    """Run every case once per round, in a rotating order, so drift hits all cases alike."""
    names = list(cases)
    got: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            got[name].append(cases[name]())
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


def machine() -> str:
    """One line describing this machine and its load."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
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
