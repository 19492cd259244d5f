"""What progress reporting costs training (issue 27): the same poprun training, reporting on and off.

    .venv/bin/python benchmarks/progress_overhead.py [--rounds 7] [--models mlp,cnn]

Both cases are the training benchmark's ``popdist-2x1`` case (``benchmarks/training_throughput.py``:
popdist_torch under poprun, 2 instances × 1 replica × 64, SGD, one fixed synthetic batch,
one compute thread per process), launched by the same poprun. *On* is poprun as users run it:
every instance counts its collectives and steps and a reporter thread writes a progress
record about once a second, which poprun takes out of the output onto its progress board.
*Off* is the same launch with the instances' ``POPDIST_PROGRESS`` removed before
``import popdist`` (the variable through which poprun asks for the records), so nothing is
wrapped, counted or written; poprun itself runs the same. The cases alternate in rotating
order for ``--rounds`` rounds; the ratio on/off is taken within each round, then the median
over rounds, so drift in the machine's load cancels.

On this 2-core machine one launch runs up to 15 % faster or slower than the next for reasons
of its own (where the scheduler puts four busy threads), so the launches alone cannot
resolve a cost of 2 %. The figure the goal reads is therefore taken *within* launches:
poprun starts the instances with reporting on, and they switch the per-step tracing (the
wrappers on the collectives, the executor's gradient group and step count) off and on every
``--block`` steps, at the same step on both instances. Within a launch a step's time also
wanders by ±10 % over about a second, so blocks of seconds (this benchmark's first design)
left the pairs 5–10 % apart; blocks of two steps cancel that wander, and a round of a few
thousand steps then holds its ratio to about 1 %. A step's time also has a long tail (the
99th percentile twice the median, now and then 20–100 ms) that falls in either half of a
round by chance: each half's figure is the mean of its steps without the fastest and slowest
5 % (``trimmed_mean``), which a cost paid on every step moves as much as the plain mean, and
which halves the spread of the rounds; the plain means' ratio is reported beside it. The
reporter thread runs throughout (switching it every two steps would stop it before its first
tick): its cost is charged to *on* as its share of the round's time, read from its own CPU
time. Launches go on (``--max-launches``, ``--budget``) until the median over rounds clears
the goal by half their IQR (issue 33).

A fixed cost a step weighs most on a fast step, so a third case, ``mlp-small`` (784-128-10,
4 gradients), is a step of a few milliseconds: at
20,000 samples/s with 2 instances × 64, a step lasts 6.4 ms and 1 % of it is 64 µs. Its
goal is on / off ≥ 0.99 (issue 33). Writes docs/progress-overhead.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))  # goals

from goals import clears

from benchmarks import training_throughput as tt
from benchmarks._common import TRIM, charged_ratios, rounds_until_clear, trimmed_mean

CASES = {"on": "progress reporting on (poprun's default)", "off": "progress reporting off"}
#: The fast-step case (issue 33): a small MLP whose step runs ≥ 20,000 samples/s (2 instances).
FAST = "mlp-small"
#: model -> the goal on / off: the training models (issue 27), the fast step (issue 33: ≤ 1 %).
GOALS = {"mlp": 0.98, "cnn": 0.98, FAST: 0.99}
AB_HEADER = ["model", "rounds × steps (launches)", "on: samples/s", "off: samples/s",
             "reporter thread", "on / off (plain means)", "on / off", "goal",
             "met with margin"]  # fmt: skip
#: model -> steps in a within-launch round: about 8 s on the 2-core machines the goals are set on.
ROUND_STEPS = {"mlp": 600, "cnn": 300, FAST: 4000}


def worker(progress: str, model: str, batch: int, warmup: int, iters: int, batches: int) -> None:
    """One instance: the training benchmark's executor worker, reporting or not."""
    if progress == "off":
        os.environ.pop("POPDIST_PROGRESS", None)  # before popdist is imported: nothing starts
    tt.worker("executor", model, batch, warmup, iters, batches)


def within(model_name: str, batch: int, warmup: int, rounds: int, steps: int, block: int) -> None:
    """One instance of a launch with reporting on: ``rounds`` rounds of ``steps`` steps, the
    tracing switched on and off every ``block`` steps (on first in even rounds, off first in
    odd ones), at the same step on both instances. Rank 0 prints ``RESULT {"on": [...],
    "off": [...], "on_step": [...], "off_step": [...], "reporter": [...]}``: per round, the
    seconds its steps with tracing on took, those with it off, the trimmed mean of a step
    on and off (:func:`~benchmarks._common.trimmed_mean`), and the reporter thread's share
    of the round's time."""
    import torch

    import popdist
    import popdist.poptorch
    import popdist_torch as poptorch
    from popdist import progress
    from popdist.collectives import lifecycle

    torch.set_num_threads(1)
    if not progress.start_if_asked():
        raise SystemExit("--within runs under poprun, with progress reporting on")
    popdist.init()
    opts = popdist.poptorch.Options()
    model = tt._model(model_name)
    wrapped = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    gen = torch.Generator().manual_seed(opts.Distributed.processId)
    x = torch.randn(batch, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    backend, tracker, reporter = lifecycle.started(), progress.tracker, progress._reporter
    attrs = backend.__dict__
    traced = {a: attrs[a] for a, _, _ in progress.TRACED if a in attrs}
    assert traced and tracker is not None and reporter is not None, "reporting is not on"
    # Off: the backend's own methods, set the same way (one dict update either way).
    plain = {a: getattr(type(backend), a).__get__(backend) for a in traced}
    for _ in range(warmup):
        wrapped(x, y)
    clock = time.perf_counter
    out: dict[str, list[float]] = {key: [] for key in ("on", "off", "on_step", "off_step")}
    out["reporter"] = []
    for r in range(rounds):
        took: tuple[list[float], list[float]] = ([], [])  # off, on: each step's seconds
        cpu0, wall0 = _thread_cpu_s(reporter.thread), clock()
        for k in range(steps):
            on = (k // block + r) % 2 == 0
            attrs.update(traced if on else plain)
            progress.tracker = tracker if on else None  # the executor's enter/leave, the group
            t0 = clock()
            wrapped(x, y)
            took[on].append(clock() - t0)
        out["reporter"].append((_thread_cpu_s(reporter.thread) - cpu0) / (clock() - wall0))
        for key, times in (("off", took[0]), ("on", took[1])):
            out[key].append(sum(times))
            out[f"{key}_step"].append(trimmed_mean(times))
    attrs.update(traced)
    progress.tracker = tracker
    if opts.Distributed.processId == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _thread_cpu_s(thread: Any) -> float:
    """Seconds ``thread`` has run on a CPU (Linux: its schedstat, in nanoseconds)."""
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as stat:
        return int(stat.read().split()[0]) * 1e-9


def hot_path(model: str, rounds: int, steps: int) -> dict[str, float]:
    """The instance-side cost measured in one process, where the machine's load cannot tell
    the two cases apart: what the executor does for progress around a step (``enter``, one
    asynchronous allreduce per parameter of ``model`` through the backend's own method, a
    do-nothing backend's, the waits as one group, ``leave`` with the step's samples),
    traced and untraced in alternating blocks; and one progress record (what the reporter
    thread builds and writes about once a second). Returns microseconds."""
    from popdist import progress

    class Null:
        def allreduce_async_(
            self, tensor: Any, *, average: bool = False, name: str | None = None
        ) -> object:
            return object()

        def wait(self, handle: object) -> None:
            return None

    grads = [p.detach().clone() for p in tt._model(model).parameters()]
    group = progress.Group("allreduce", [f"g{i}" for i in range(len(grads))], grads)
    tracker = progress.Tracker()
    backend = Null()
    launch, wait = backend.allreduce_async_, backend.wait

    def block(on: bool) -> float:
        progress.tracker = tracker if on else None
        caller = sys._getframe()
        t0 = time.perf_counter()
        for _ in range(steps):
            outer = progress.enter(caller)
            handles = [launch(g, name="g") for g in grads]
            progress.wait_group(group, wait, handles)
            progress.leave(outer, 64, 0.01)
        return (time.perf_counter() - t0) / steps

    extra = []
    for _ in range(rounds):
        off, on = block(False), block(True)
        extra.append(on - off)
    progress.tracker = tracker
    reporter = progress.Reporter(tracker, "0" * 32, 0.0, {})
    records = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        line = f"{progress.MARKER}x {json.dumps(reporter.record(time.monotonic()))}\n".encode()
        records.append(time.perf_counter() - t0)
        del line
    progress.tracker = None
    return {
        "collectives_per_step": 2 * len(grads),
        "step_us": statistics.median(extra) * 1e6,
        "record_us": statistics.median(records) * 1e6,
    }


def _argv(progress: str, model: str, timing: list[str]) -> list[str]:
    from benchmarks._common import which

    me = str(Path(__file__).resolve())
    return [
        which("poprun"), "--num-instances", "2", "--num-replicas", "2",
        sys.executable, me, "--worker", progress, "--model", model, "--batch", str(tt.MICRO),
        *timing,
    ]  # fmt: skip


def _within(model: str, launches: int, args: argparse.Namespace) -> dict[str, Any]:
    """At least ``launches`` launches of the within-launch A/B worker, more until the rounds
    clear the model's goal with margin (``--max-launches``, ``--budget`` a model): per round
    the seconds on and off, the reporter's share and the round's ratio, and the launches."""
    steps = ROUND_STEPS[model]
    timing = ["--warmup", str(args.warmup), "--rounds-per-launch", str(args.rounds_per_launch),
              "--round-steps", str(steps), "--block", str(args.block)]  # fmt: skip
    got: dict[str, list[float]] = {k: [] for k in ("on", "off", "on_step", "off_step", "reporter")}

    def one_launch(_: int) -> None:
        result = tt.launch_result(_argv("within", model, timing))
        for key, values in got.items():
            values.extend(result[key])

    def ratios() -> list[float]:
        return charged_ratios(got["on_step"], got["off_step"], got["reporter"])

    ran = rounds_until_clear(
        one_launch, launches, settled=lambda: clears(ratios(), GOALS[model], "≥"),
        max_rounds=args.max_launches, budget_s=args.budget,
    )  # fmt: skip
    done = ratios()
    samples = tt.MICRO * 2 * steps / 2  # a round's samples, on (and off), both instances
    means = charged_ratios(got["on"], got["off"], got["reporter"])  # the plain means
    return {**got, "ratios": done, "ratio": statistics.median(done), "launches": ran,
            "mean_ratios": means, "mean_ratio": statistics.median(means), "trim": TRIM,
            "round_steps": steps, "block": args.block,
            "rate": {"on": [samples / s for s in got["on"]],
                     "off": [samples / s for s in got["off"]]}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=(*CASES, "within"), help=argparse.SUPPRESS)
    parser.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=tt.MICRO, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=7, help="launches on and off, interleaved")
    parser.add_argument("--models", default=f"mlp,cnn,{FAST}")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--launches", type=int, default=2, help="within-launch A/B launches")
    parser.add_argument("--rounds-per-launch", type=int, default=5, help="A/B rounds a launch")
    parser.add_argument("--round-steps", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--block", type=int, default=2, help="steps on, then steps off")
    parser.add_argument("--max-launches", type=int, default=4, help="A/B launches until margin")
    parser.add_argument("--budget", type=float, default=200, help="A/B seconds a model")
    args = parser.parse_args()
    if args.worker == "within":
        within(
            args.model, args.batch, args.warmup, args.rounds_per_launch, args.round_steps,
            args.block,
        )  # fmt: skip
        return
    if args.worker:
        worker(args.worker, args.model, args.batch, args.warmup, args.iters, args.batches)
        return

    from benchmarks._common import Summary, interleave, save_results, table, write_doc

    timing = ["--warmup", str(args.warmup), "--iters", str(args.iters)]
    timing += ["--batches", str(args.batches)]
    models = args.models.split(",")

    def case(argv: list[str]) -> Callable[[], float]:
        return lambda: tt._launch(argv)[0]

    cases = {f"{m}/{p}": case(_argv(p, m, timing)) for m in models for p in CASES}
    results = interleave(cases, args.rounds)
    ab = {m: _within(m, args.launches, args) for m in models}
    out: dict[str, Any] = {
        "rounds": args.rounds,
        "timing": timing,
        "within": {
            "launches": args.launches,
            "rounds_per_launch": args.rounds_per_launch,
            "round_steps": ROUND_STEPS,
            "block": args.block,
        },
        "models": {},
    }
    rows, ab_rows, hot_rows = [], [], []
    for m in models:
        on, off = results[f"{m}/on"], results[f"{m}/off"]
        across = statistics.median(a / b for a, b in zip(on.samples, off.samples, strict=True))
        a_on, a_off = Summary(tuple(ab[m]["rate"]["on"])), Summary(tuple(ab[m]["rate"]["off"]))
        ratios = Summary(tuple(ab[m]["ratios"]))
        hot = hot_path(m, rounds=15, steps=200)
        step_s = 2 * tt.MICRO / a_off.median  # one step of the 2 instances, at the "off" rate
        # A step's tracing, plus one record a second, against the step: what "on" costs.
        expected = step_s / (step_s + hot["step_us"] * 1e-6 + hot["record_us"] * 1e-6 * step_s)
        out["models"][m] = {
            "ratio": ab[m]["ratio"],  # the goal's figure: within launches
            "median": {"on": a_on.median, "off": a_off.median},
            "within": ab[m],
            "across": {
                "samples_per_s": {"on": list(on.samples), "off": list(off.samples)},
                "median": {"on": on.median, "off": off.median},
                "ratio": across,
            },
            "hot_path": {**hot, "step_ms": step_s * 1e3, "expected_ratio": expected},
        }
        ab_rows.append([
            m.upper(), f"{len(ratios.samples)} × {ab[m]['round_steps']} ({ab[m]['launches']})",
            f"{a_on.median:.0f} (IQR {a_on.iqr:.0f})", f"{a_off.median:.0f} (IQR {a_off.iqr:.0f})",
            f"{100 * statistics.median(ab[m]['reporter']):.3f} %",
            f"{ab[m]['mean_ratio']:.4f} (IQR {Summary(tuple(ab[m]['mean_ratios'])).iqr:.4f})",
            f"{ab[m]['ratio']:.4f} (IQR {ratios.iqr:.4f})",
            f"≥ {GOALS[m]}", "yes" if clears(list(ratios.samples), GOALS[m], "≥") else "no",
        ])  # fmt: skip
        rows.append([
            m.upper(), f"{on.median:.0f} (IQR {on.iqr:.0f})", f"{off.median:.0f} (IQR {off.iqr:.0f})",
            f"{across:.3f}",
        ])  # fmt: skip
        hot_rows.append([
            m.upper(), str(hot["collectives_per_step"]), f"{hot['step_us']:.1f}",
            f"{hot['record_us']:.0f}", f"{step_s * 1e3:.1f}", f"{expected:.4f}",
        ])  # fmt: skip
    save_results("progress-overhead", out)
    doc = __doc__ or ""
    header = ["model", "on: samples/s (median)", "off: samples/s (median)", "on / off"]
    body = "\n\n".join(
        [
            doc.split("\n\n", 2)[2].strip(),
            f"### Within launches (the goal's figure)\n\nAt least {args.launches} launches a "
            f"model of {args.rounds_per_launch} rounds each (more launches, up to "
            f"{args.max_launches}, until the goal clears with margin). In a round the tracing is "
            f"switched every {args.block} steps; on / off is a step's time off over its "
            f"time on, each the mean without the fastest and slowest {100 * TRIM:.0f} % of the "
            "round's steps, times one less the reporter thread's share of the round (its CPU "
            "time over the round's); the plain means' ratio is shown beside it. "
            f"Goals: on / off ≥ 0.98 (issue 27); on the fast step ({FAST}, 784-128-10, "
            "≥ 20,000 samples/s for the 2 instances) ≥ 0.99, reporting costing ≤ 1 % "
            "(issue 33). *Met with margin*: the median over rounds clears the goal by half "
            "their IQR.",
            table(AB_HEADER, ab_rows),
            f"### Across launches\n\n{args.rounds} rounds; per launch {' '.join(timing)}; "
            "on / off: the median of the ratios per round. The launches' own spread is shown "
            "by the IQRs.",
            table(header, rows),
            "### In one process\n\nThe instance-side cost without any launch (`hot_path()`: "
            "a step's collectives traced and untraced in alternating blocks on a backend that "
            "does nothing, and the building of one record, which the reporter thread does "
            "about once a second):",
            table(
                [
                    "model",
                    "collectives a step",
                    "tracing a step (µs)",
                    "one record (µs)",
                    "step, off (ms)",
                    "expected on / off",
                ],
                hot_rows,
            ),
        ]
    )
    path = write_doc(
        "progress-overhead.md", "Progress reporting: training throughput on and off", body
    )
    print(body)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
