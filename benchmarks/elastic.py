"""A lost host: detection, recovery and steps recomputed, per fault, beside today's poprun and mpirun.

Three namespace hosts with sshd (``tests/multihost/hosts.py``), one instance each, 6 replicas,
``tests/bin/elastic_train.py`` (a checkpoint after every step). Once h3's instance has logged
its third step, h3 is lost in one of four ways: its instance killed (SIGKILL), the host
crashed (every process there killed, sshd too: ssh is refused), its network cut silently
(its switch port down), or frozen (SIGSTOP on every process there). Per fault and round:

- ``poprun --min-hosts 2``: *detection*, the fault until poprun's line naming h3; *recovery*,
  the fault until the first step logged by the smaller job (generation 1); *steps
  recomputed*, the steps generation 0 logged that generation 1 trained again (at most the
  steps since the last checkpoint: 1 here); and whether it ended with exit 0.
- where the recovery goes (``poprun -v``'s lines and the program's own phase records,
  ``DIR/phases``, all in wall-clock time from the fault): the job ended (mpirun exited), the
  relaunch line, the new mpirun started, its launchers (Open MPI's daemons, mpirun) started,
  the instances' processes started, their imports done, ``popdist.init()`` done, the resume
  done (the slowest instance for each), the first step (the first instance).
- today's poprun (``/work/main``'s, or ``--today POPRUN``) with ``--max-restarts 2``, and bare
  ``mpirun`` on the same fault: the fault until the launcher exits, and its exit code
  (``--cap`` seconds at most: a launcher still running then is killed and shown as such).

Each figure is the median of ``--rounds`` runs with its spread (min-max). Needs root.

    .venv/bin/python benchmarks/elastic.py [--rounds 3] [--anchor-rounds 1] [--cap 60]

A quick look at one fault, without the anchors and without writing the docs:
``--faults killed --rounds 1 --anchor-rounds 0 --no-write``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from _common import ROOT, compile_sources, save_results, which, write_doc

from tests.multihost.hosts import Hosts, unavailable

PY = sys.executable
PROGRAM = str(ROOT / "tests" / "bin" / "elastic_train.py")
FAULTS = ("killed", "crashed", "cut", "frozen")
STEPS, FAULT_AFTER = "10", 3
LAUNCH = ["--num-instances", "3", "--num-replicas", "6", "-H", "h1,h2,h3"]
ELASTIC = "poprun --min-hosts 2"


def _env(hosts: Hosts) -> dict[str, str]:
    """The launchers' environment: no PYTHONPATH, so today's poprun runs its own code."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OMPI_", "PMIX_", "POPDIST_")) and k != "PYTHONPATH"
    }
    return hosts.env(base)


class Run:
    """A launcher started on h1; its output lines with their arrival times. A launcher
    written ``PYTHONPATH=DIR`` first runs with DIR's packages (``--tree``)."""

    def __init__(self, hosts: Hosts, argv: list[str]) -> None:
        env = _env(hosts)
        if argv[0].startswith("PYTHONPATH="):
            env["PYTHONPATH"] = argv[0].partition("=")[2]
            argv = argv[1:]
        self.proc = subprocess.Popen(
            hosts.on("h1", argv, cwd=str(ROOT)), env=env, cwd=ROOT,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.walls: list[float] = []  # each line's arrival, wall clock (the phases' clock)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.walls.append(time.time())
            self.lines.append((time.monotonic(), line))

    def first(self, words: str) -> float | None:
        return next((at for at, line in self.lines if words in line), None)

    def walls_of(self, words: str) -> list[float]:
        """The wall-clock arrival of every line holding ``words``."""
        return [at for at, (_, line) in zip(self.walls, self.lines, strict=False) if words in line]

    def end(self, cap: float) -> tuple[int | None, float]:
        """(exit code or None when killed at the cap, when it ended)."""
        try:
            code: int | None = self.proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            code = None
        ended = time.monotonic()
        self.reader.join(timeout=5)
        return code, ended


def _inject(hosts: Hosts, fault: str) -> None:
    if fault == "killed":
        for pid in hosts.processes("h3", "elastic_train.py"):
            if b"poprun-instance" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
    elif fault == "crashed":
        hosts.crash("h3")
    elif fault == "cut":
        hosts.cut("h3")
    else:
        hosts.freeze("h3")


def _heal(hosts: Hosts, fault: str) -> None:
    if fault == "cut":
        hosts.cut("h3", down=False)
    elif fault == "frozen":
        hosts.freeze("h3", frozen=False)
    hosts.close_jobs()


def _wait_for_step(run: Run, log: Path) -> bool:
    deadline = time.monotonic() + 240
    while not (log.exists() and len(log.read_text().splitlines()) >= FAULT_AFTER):
        if run.proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _watch_g1(directory: Path, run: Run, seen: list[float]) -> None:
    """Note when the smaller job (generation 1) logged its first step (polled every 20 ms)."""
    while run.proc.poll() is None:
        if any(p.stat().st_size for p in (directory / "log").glob("*.g1")):
            seen.append(time.monotonic())
            return
        time.sleep(0.02)


#: The start of poprun's line that names the lost host (its fourth word).
LOST_LINE = "poprun: lost host "
#: The phases of a recovery, in order: (name, how it is read).
PHASES = (
    ("named", "poprun's line naming h3"),
    ("ended", "mpirun of generation 0 exited"),
    ("relaunch", "poprun's line: launching the job again"),
    ("mpirun", "mpirun of generation 1 started"),
    ("launchers", "the last launcher (orted, or mpirun on h1) started"),
    ("process", "the last instance's process started"),
    ("imported", "the last instance's imports done"),
    ("init", "the last instance's popdist.init() done"),
    ("resumed", "the last instance's resume done"),
    ("step", "the first step of generation 1"),
)


def _phases(directory: Path, run: Run, fault_wall: float) -> dict[str, float]:
    """Each phase of the recovery, seconds after the fault (those that were seen)."""
    out: dict[str, float] = {}
    named = run.walls_of("lost host h3")
    if not named:
        return out
    out["named"] = named[0]
    relaunch = run.walls_of("launching the job again")
    if relaunch:
        out["relaunch"] = relaunch[0]
    ended = [at for at in run.walls_of("mpirun exited with status") if at <= out.get("relaunch", 0)]
    if ended:  # the last before the relaunch: generation 0's (it may end before h3 is named)
        out["ended"] = ended[-1]
    waits = run.walls_of("Waiting for mpirun")
    if len(waits) > 1:
        out["mpirun"] = waits[1]
    records: dict[str, list[float]] = {}
    for path in (directory / "phases").glob("*.g1"):
        for line in path.read_text().splitlines():
            name, at = line.split()
            key = "launchers" if name in ("orted", "mpirun", "orterun", "launcher") else name
            records.setdefault(key, []).append(float(at))
    for key, values in records.items():
        out[key] = min(values) if key == "step" else max(values)
    return {key: round(out[key] - fault_wall, 3) for key, _ in PHASES if key in out}


def _recomputed(directory: Path) -> int:
    steps: dict[int, set[int]] = {}
    for path in (directory / "log").glob("*.g*"):
        for line in path.read_text().splitlines():
            step, gen, _ = line.split()
            steps.setdefault(int(step), set()).add(int(gen))
    return sum(1 for gens in steps.values() if {0, 1} <= gens)


def one(hosts: Hosts, fault: str, launcher: str, argv: list[str], cap: float) -> dict[str, object]:
    """One run of ``argv`` with ``fault`` injected: what it measured."""
    directory = Path(tempfile.mkdtemp(prefix="elastic-"))
    try:
        run = Run(hosts, [*argv, PROGRAM, str(directory), STEPS])
        if not _wait_for_step(run, directory / "log" / "2.g0"):
            run.end(5)
            return {"error": "the job did not reach the fault", "output": _tail(run)}
        fault_at, fault_wall = time.monotonic(), time.time()
        _inject(hosts, fault)
        seen: list[float] = []
        watcher = threading.Thread(target=_watch_g1, args=(directory, run, seen), daemon=True)
        watcher.start()
        code, ended = run.end(cap)
        watcher.join(timeout=1)
        out: dict[str, object] = {"code": code, "ended_s": ended - fault_at}
        if launcher.startswith(ELASTIC):
            named = run.first("lost host h3")
            out["detection_s"] = None if named is None else named - fault_at
            lost = [line.split()[3] for _, line in run.lines if line.startswith(LOST_LINE)]
            out["lost"] = lost[0] if lost else None  # h3, never a healthy host (issue 51)
            out["named_right"] = 1.0 if lost[:1] == ["h3"] else 0.0
            out["recovery_s"] = seen[0] - fault_at if seen else None
            out["recomputed"] = _recomputed(directory)
            out["phases"] = _phases(directory, run, fault_wall)
        if code != 0:
            out["output"] = _tail(run)
        return out
    finally:
        _heal(hosts, fault)
        shutil.rmtree(directory, ignore_errors=True)


def _tail(run: Run) -> str:
    return "".join(line for _, line in run.lines[-12:])


def _launchers(today: str | None, trees: Sequence[str] = ()) -> dict[str, list[str]]:
    poprun = which("poprun")
    cases = {ELASTIC: [poprun, "-v", *LAUNCH, "--min-hosts", "2", PY]}
    for tree in trees:  # the same, with another checkout's packages (poprun's, the instances')
        commit = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or tree  # fmt: skip
        cases[f"{ELASTIC} @ {commit}"] = [f"PYTHONPATH={tree}", PY, "-P", "-m", "poprun",
                                           *cases[ELASTIC][1:]]  # fmt: skip
    if today:
        today_py = str(Path(today).parent / "python")
        cases["today's poprun --max-restarts 2"] = [today, *LAUNCH, "--max-restarts", "2",
                                                    today_py]  # fmt: skip
    mpirun = shutil.which("mpirun") or "mpirun"
    cases["mpirun"] = [mpirun, "--allow-run-as-root", "-H", "h1:1,h2:1,h3:1", "-np", "3", PY]
    return cases


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--anchor-rounds", type=int, default=1)
    parser.add_argument("--cap", type=float, default=60.0)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--today", default="/work/main/.venv/bin/poprun")
    parser.add_argument("--no-write", action="store_true", help="print only: leave docs/ alone")
    parser.add_argument("--tree", action="append", default=[],
                        help="also measure another checkout's poprun (a worktree at an older "
                        "commit: before/after), its rounds alternating with this one's")  # fmt: skip
    args = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        print(f"elastic benchmark skipped: {reason}")
        return 0
    today = args.today if Path(args.today).exists() else None
    results: dict[str, dict[str, list[dict[str, object]]]] = {}
    for tree in args.tree:
        compile_sources(Path(tree))  # as this checkout's: bytecode, not the compiler
    launchers = _launchers(today, args.tree)
    for fault in args.faults.split(","):
        results[fault] = {}
        for round_ in range(max(args.rounds, args.anchor_rounds)):  # launchers alternate
            for launcher, argv in launchers.items():
                ours = launcher.startswith(ELASTIC)
                if round_ >= (args.rounds if ours else args.anchor_rounds):
                    continue
                with Hosts(3) as hosts:  # fresh hosts: a crash takes sshd with it
                    got = one(hosts, fault, launcher, argv, args.cap)
                shown = {k: v for k, v in got.items() if k != "output"}
                print(fault, launcher, shown, flush=True)
                if got.get("code") != 0 and "output" in got:
                    print(got["output"], flush=True)
                results[fault].setdefault(launcher, []).append(got)
    summary = _summarise(results)
    print(_render_phases(summary), flush=True)
    if args.no_write:
        return 0
    save_results("elastic-benchmark", summary)  # this CPU's record; the others stay
    write_doc("elastic-benchmark.md", "A lost host: detection, recovery, recomputed steps",
              _render(summary, args))  # fmt: skip
    return 0


def _summarise(results: dict[str, dict[str, list[dict[str, object]]]]) -> dict[str, object]:
    out: dict[str, object] = {"faults": {}}
    for fault, by_launcher in results.items():
        row: dict[str, object] = {}
        for launcher, runs in by_launcher.items():
            entry: dict[str, object] = {"runs": runs, "codes": [r.get("code") for r in runs]}
            for key in ("detection_s", "recovery_s", "ended_s", "recomputed", "named_right"):
                values = [float(r[key]) for r in runs if r.get(key) is not None]  # type: ignore[arg-type]
                if values:
                    entry[key] = _spread(values)
            phases: list[dict[str, float]] = [
                p for r in runs if isinstance(p := r.get("phases"), dict)
            ]
            if phases:
                entry["phases"] = {
                    key: _spread([float(p[key]) for p in phases if key in p])
                    for key, _ in PHASES
                    if any(key in p for p in phases)
                }
            row[launcher] = entry
        out["faults"][fault] = row  # type: ignore[index]
    return out


def _fmt(entry: dict[str, object], key: str, unit: str = " s") -> str:
    spread = entry.get(key)
    if not isinstance(spread, dict):
        return "—"
    return f"{spread['median']:.1f}{unit} ({spread['min']:.1f}–{spread['max']:.1f})"


def _render(summary: dict[str, object], args: argparse.Namespace) -> str:
    lines = [
        f"Rounds: {args.rounds} for poprun --min-hosts 2, {args.anchor_rounds} for each anchor; "
        f"anchors killed after {args.cap:g} s. Median (min–max).",
        "",
        "| fault | detection | recovery | steps recomputed | host named | exit codes | "
        "today's poprun --max-restarts 2: ended after, exit | mpirun: ended after, exit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    faults = summary["faults"]
    assert isinstance(faults, dict)
    for fault, row in faults.items():
        ours = row.get(ELASTIC, {})
        cells = [fault, _fmt(ours, "detection_s"), _fmt(ours, "recovery_s"),
                 _fmt(ours, "recomputed", ""), _named(ours),
                 ", ".join(map(str, ours.get("codes", [])))]  # fmt: skip
        for anchor in ("today's poprun --max-restarts 2", "mpirun"):
            entry = row.get(anchor)
            if entry is None:
                cells.append("—")
                continue
            codes = ", ".join("killed at the cap" if c is None else str(c) for c in entry["codes"])
            cells.append(f"{_fmt(entry, 'ended_s')}, {codes}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + _render_phases(summary)


def _named(entry: dict[str, object]) -> str:
    """Which host each round's lost-host line named: ``h3 in 3 of 3`` (else the others)."""
    runs = entry.get("runs")
    if not isinstance(runs, list) or not runs:
        return "—"
    named = [r.get("lost") for r in runs if isinstance(r, dict)]
    right = sum(1 for host in named if host == "h3")
    wrong = sorted({str(host) for host in named if host != "h3"})
    return f"h3 in {right} of {len(named)}" + (f" (else {', '.join(wrong)})" if wrong else "")


def _render_phases(summary: dict[str, object]) -> str:
    """Where the recovery goes: each phase's median time after the fault, per fault (and
    per launcher, with ``--tree``)."""
    faults = summary["faults"]
    assert isinstance(faults, dict)
    shown = [(fault, launcher) for fault, row in faults.items() for launcher, entry in row.items()
             if launcher.startswith(ELASTIC) and "phases" in entry]  # fmt: skip
    if not shown:
        return ""
    several = len({launcher for _, launcher in shown}) > 1
    names = [f"{f} ({launcher[len(ELASTIC):].strip(' @') or 'this'})" if several else f
             for f, launcher in shown]  # fmt: skip
    lines = [
        "Where the recovery goes: seconds after the fault, median (min–max) of the rounds.",
        "",
        "| phase | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(shown),
    ]
    for key, what in PHASES:
        cells = []
        for fault, launcher in shown:
            spread = faults[fault][launcher]["phases"].get(key)
            cells.append(
                "—" if spread is None
                else f"{spread['median']:.1f} ({spread['min']:.1f}–{spread['max']:.1f})"
            )  # fmt: skip
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
