"""Every performance goal as a record, and how a record is judged and rendered.

A :class:`Goal` says what is measured (a figure read from a benchmark's JSON in ``docs/``),
against which anchor, the threshold and its direction. ``GOALS`` is the table
``run_all.py`` evaluates into the headline of ``docs/performance.md``; adding a goal is
adding one record. A figure is a small function of the benchmark's results
(:func:`at`, :func:`ratio`, :func:`difference` build the usual ones); a goal whose figure is
missing is shown "not measured", or left out when it is ``optional`` (a size or an instance
count the run did not include).
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: A figure: one number read or computed from a benchmark's results (its JSON).
Figure = Callable[[Any], float]
#: A row of the headline table: goal, measured, ratio, met?
Row = list[str]

#: direction → the comparison a measurement must pass against the threshold.
DIRECTIONS: dict[str, Callable[[float, float], bool]] = {
    "≥": operator.ge,
    "≤": operator.le,
    "<": operator.lt,
}
MB = 1 << 20


def at(*key: str) -> Figure:
    """The number at ``key`` (a path of JSON keys)."""

    def figure(data: Any) -> float:
        for part in key:
            data = data[part]
        return float(data)

    return figure


def median_at(*key: str) -> Figure:
    """The median of the list at ``key``."""

    def figure(data: Any) -> float:
        for part in key:
            data = data[part]
        return float(statistics.median(data))

    return figure


def ratio(measured: Figure, anchor: Figure) -> Figure:
    return lambda data: measured(data) / anchor(data)


def difference(measured: Figure, anchor: Figure) -> Figure:
    return lambda data: measured(data) - anchor(data)


@dataclass(frozen=True)
class Goal:
    """One goal: ``figure`` of benchmark ``source`` compared with ``threshold``.

    ``name`` and ``detail`` (the "measured" column) are format strings over ``fields``,
    figures of the same results (the measurement and its anchor, side by side). Without a
    threshold the figure is reported, not judged. ``also`` is a further condition the
    results must meet (say, no heavy module imported).
    """

    name: str
    source: str
    figure: Figure
    threshold: float | None = None
    direction: str = "≥"
    detail: str = ""
    fields: Mapping[str, Figure] = field(default_factory=dict)
    optional: bool = False
    also: Callable[[Any], bool] | None = None
    #: What the "measured" column says when the results lack the figure.
    missing: str = "not measured"

    def __post_init__(self) -> None:
        if self.threshold is not None and self.direction not in DIRECTIONS:
            raise ValueError(
                f"{self.name}: direction {self.direction!r} is not one of {list(DIRECTIONS)}"
            )


@dataclass(frozen=True)
class Verdict:
    """A goal judged: its figure (``None`` when not measured) and whether it is met."""

    goal: Goal
    name: str
    value: float | None
    met: bool | None
    detail: str

    def row(self) -> Row:
        return [
            self.name,
            self.detail,
            "—" if self.value is None else f"{self.value:.2f}",
            "—" if self.met is None else ("**yes**" if self.met else "**no**"),
        ]


def evaluate(goal: Goal, results: Mapping[str, Any]) -> Verdict | None:
    """Judge ``goal`` on ``results`` (benchmark name → its JSON); ``None``: leave it out."""
    data = results.get(goal.source)
    try:
        if data is None:
            raise KeyError(goal.source)
        shown = {name: fig(data) for name, fig in goal.fields.items()}
        value = goal.figure(data)
    except (KeyError, TypeError, ZeroDivisionError):
        if goal.optional:
            return None
        return Verdict(goal, goal.name.format_map(_Blank()), None, None, goal.missing)
    met = None
    if goal.threshold is not None:
        met = DIRECTIONS[goal.direction](value, goal.threshold)
        if goal.also is not None:
            met = met and goal.also(data)
    return Verdict(goal, goal.name.format(**shown), value, met, goal.detail.format(**shown))


class _Unknown:
    """A figure that was not measured, in a goal's name: "?" whatever its format."""

    def __format__(self, spec: str) -> str:
        return "?"


class _Blank(dict[str, _Unknown]):
    """The fields of a goal that was not measured."""

    def __missing__(self, key: str) -> _Unknown:
        return _Unknown()


def headline(goals: tuple[Goal, ...], results: Mapping[str, Any]) -> list[Row]:
    return [v.row() for g in goals if (v := evaluate(g, results)) is not None]


# -- the table ----------------------------------------------------------------------------
SIZES = (16, 64, 256)


def _launchers() -> list[Goal]:
    def med(job: str, name: str, n: int) -> Figure:
        return at(job, name, str(n), "median")

    goals = []
    for n in (1, 2, 4):
        pop, bare = med("trivial", "poprun", n), med("trivial", "mpirun", n)
        goals.append(Goal(
            f"issue 7: poprun − bare mpirun, trivial job, {n} instances ≤ +0.12 s", "launchers",
            difference(pop, bare), 0.12, "≤", "{a:.3f} s vs {b:.3f} s", {"a": pop, "b": bare},
            optional=True))  # fmt: skip
    for n in (1, 2, 4):
        pop, bare = med("backend", "poprun", n), med("backend", "mpirun", n)
        goals.append(Goal(
            f"issue 7: poprun / bare mpirun, job starting Horovod, {n} instances ≤ 1.1×",
            "launchers", ratio(pop, bare), 1.1, "≤", "{a:.3f} s vs {b:.3f} s",
            {"a": pop, "b": bare}, optional=True))  # fmt: skip
    for n in (1, 2, 4):
        pop, peer = med("backend", "poprun", n), med("backend", "torchrun", n)
        goals.append(Goal(
            f"issue 7: poprun + popdist.init() < torchrun + init_process_group, {n} instances",
            "launchers", ratio(pop, peer), 1.0, "<", "{a:.3f} s vs {b:.3f} s",
            {"a": pop, "b": peer}, optional=True))  # fmt: skip
    return goals


def _launch_overhead() -> list[Goal]:
    def m(name: str) -> Figure:
        return at(name, "median")

    trivial = m("trivial: poprun 2 instances"), m("trivial: mpirun -np 2")
    horovod = m("Horovod: poprun 2 instances"), m("Horovod: mpirun -np 2")
    return [
        Goal("issue 3: poprun − mpirun (same flags), `import popdist`, 2 instances ≤ +0.12 s",
             "launch-overhead", difference(*trivial), 0.12, "≤", "{a:.3f} s vs {b:.3f} s",
             {"a": trivial[0], "b": trivial[1]}),
        Goal("issue 3: poprun / mpirun (same flags), popdist.init(), 2 instances ≤ 1.1×",
             "launch-overhead", ratio(*horovod), 1.1, "≤", "{a:.3f} s vs {b:.3f} s",
             {"a": horovod[0], "b": horovod[1]}, optional=True),
        Goal("issue 3: `poprun --help` < 0.3 s", "launch-overhead",
             ratio(m("poprun --help"), lambda _: 0.3), 1.0, "<", "{h:.3f} s",
             {"h": m("poprun --help")}),
        Goal("issue 3: `import popdist` ≤ 1.3× bare python", "import-cost", at("ratio"), 1.3, "≤",
             "{r:.2f}× (median wall)", {"r": at("ratio")}, also=lambda data: not data["heavy"]),
    ]  # fmt: skip


def _allreduce() -> list[Goal]:
    goals = []
    for mb in SIZES:
        size = str(mb * MB)

        def b(name: str, size: str = size) -> Figure:
            return at(size, "algbw", name)

        goals.append(Goal(
            f"issue 7: gradient path / raw MPI allreduce algbw, {mb} MB, 4 KB pages ≥ 0.9",
            "allreduce", at(size, "ratio", "4k_pages"), 0.9, "≥",
            "{a:.2f} vs {b:.2f} GB/s (medians; ratio: median per round)",
            {"a": b("horovod"), "b": b("mpi4py")}, optional=True))  # fmt: skip
        goals.append(Goal(
            f"issue 7: gradient path / raw MPI allreduce algbw, {mb} MB, 2 MB pages ≥ 0.9",
            "allreduce", at(size, "ratio", "2m_pages"), 0.9, "≥",
            "{a:.2f} vs {b:.2f} GB/s ({share:.0f}% of numpy a+b)",
            {"a": b("horovod-2mb"), "b": b("mpi4py-numpy"),
             "share": lambda d, b=b: 100 * b("horovod-2mb")(d) / b("memory")(d)},
            optional=True))  # fmt: skip
    return goals


#: Training goals: (goal, case, anchor as users run it, ratio key, ratio against the anchor
#: under the executor's conditions, what that anchor is, target).
TRAINING = (
    ("issue 5: {tag} 1 instance × 4 replicas ≥ 0.9× plain torch on 4× batch", "popdist-1x4", "plain-128",
     "local_replicas_1x4_vs_plain_128", "local_replicas_1x4_vs_plain_128_under_poprun",
     "plain torch launched by poprun too (the executor's own cost)", 0.9),
    ("issues 5, 7: {tag} 2 instances ≥ 1.0× torchrun + DDP", "popdist-2x1", "ddp-2",
     "popdist_2x1_vs_ddp_2", "popdist_2x1_vs_ddp_2_same_allocator",
     "DDP with poprun's malloc settings", 1.0),
    ("issues 5, 7: {tag} 2 instances ≥ 1.0× Horovod DistributedOptimizer", "popdist-2x1", "hvd-2",
     "popdist_2x1_vs_hvd_2", "popdist_2x1_vs_hvd_2_same_allocator",
     "Horovod with poprun's malloc settings", 1.0),
)  # fmt: skip


def _training() -> list[Goal]:
    goals = []
    for model in ("mlp", "cnn"):
        big = model.upper()

        def r(key: str, model: str = model) -> Figure:
            return at(model, "ratios", key)

        def md(case: str, model: str = model) -> Figure:
            return at(model, "median", case)

        rounds = at(model, "rounds")
        for text, case, anchor, key, strict_key, strict_label, target in TRAINING:
            goals.append(Goal(
                text.replace("{tag}", big + " ({rounds:.0f} rounds)"), "training", r(key), target,
                "≥", "{a:.0f} vs {b:.0f} samples/s; against " + strict_label + ": {strict:.2f}",
                {"a": md(case), "b": md(anchor), "strict": r(strict_key), "rounds": rounds},
                optional=True))  # fmt: skip
        goals.append(Goal(
            f"issue 7: {big} scaling efficiency 2 vs 1 (popdist / DDP / Horovod)", "training",
            r("scaling_popdist"), None, "≥", "{p:.2f} / {d:.2f} / {h:.2f}",
            {"p": r("scaling_popdist"), "d": r("scaling_ddp"), "h": r("scaling_hvd")},
            optional=True))  # fmt: skip
        goals.append(Goal(
            f"issue 7: {big} executor overhead, 1 instance × 1 replica / plain torch", "training",
            r("popdist_1x1_vs_plain_64"), None, "≥", "{a:.0f} vs {b:.0f} samples/s",
            {"a": md("popdist-1x1"), "b": md("plain-64")}, optional=True))  # fmt: skip
    return goals


def _torch_backend() -> list[Goal]:
    goals = []
    for mb in SIZES:
        for key, anchor in (
            ("torch_vs_horovod", "Horovod's"),
            ("torch_vs_mpi", "raw MPI_Allreduce"),
        ):
            got = at("allreduce", str(mb * MB), key)
            goals.append(Goal(
                f"issue 19: torch backend gradient path / {anchor}, {mb} MB ≥ 0.9", "torch-backend",
                got, 0.9, "≥", "{r:.2f}× (median per round)", {"r": got}, optional=True))  # fmt: skip
    got = at("training", "ratios", "torch_vs_ddp")
    goals.append(Goal(
        "issue 19: MLP training, --backend torch ≥ 1.0× torchrun + DDP", "torch-backend", got, 1.0,
        "≥", "{r:.2f}× (median per round)", {"r": got}, optional=True))  # fmt: skip
    goals.append(Goal(
        "issue 19: GPU, 1 instance × N local replicas ≥ 0.9× plain torch on the N× batch",
        "gpu-check", at("ratio"), None, "≥",
        missing="not measured here: `make gpu-check` on a machine with a GPU"))  # fmt: skip
    return goals


def _multihost() -> list[Goal]:
    def lm(name: str) -> Figure:
        return at("launch", name, "median")

    goals = [
        Goal("issue 16: 2 hosts, poprun + popdist.init() ≤ 1.1× bare mpirun, same hosts",
             "multihost-benchmark", at("ratios", "poprun_vs_mpirun"), 1.1, "≤",
             "{a:.3f} s vs {b:.3f} s (without the ssh check {c:.2f}×)",
             {"a": lm("poprun"), "b": lm("mpirun"), "c": at("ratios", "poprun_no_check_vs_mpirun")}),
        Goal("issue 16: 2 hosts, poprun + popdist.init() < torchrun --nnodes 2 (c10d)",
             "multihost-benchmark", at("ratios", "poprun_vs_torchrun"), 1.0, "<",
             "{a:.3f} s vs {b:.3f} s", {"a": lm("poprun"), "b": lm("torchrun --nnodes 2")}),
    ]  # fmt: skip
    for mb in SIZES:
        size = str(mb * MB)
        goals.append(Goal(
            f"issue 16: 2 hosts, gradient path / raw MPI_Allreduce, {mb} MB ≥ 0.9",
            "multihost-benchmark", at("allreduce", size, "ratio"), 0.9, "≥",
            "{a:.3f} vs {b:.3f} GB/s (ratio: median per round)",
            {"a": at("allreduce", size, "algbw", "horovod"),
             "b": at("allreduce", size, "algbw", "mpi4py")}, optional=True))  # fmt: skip
    return goals


def _slurm() -> list[Goal]:
    def lm(name: str) -> Figure:
        return at("launch", name, "median")

    return [
        Goal("issue 26: Slurm allocation, poprun + popdist.init() ≤ 1.1× mpirun + hvd.init(), "
             "same allocation", "slurm-benchmark", at("ratios", "poprun_vs_mpirun"), 1.1, "≤",
             "{a:.3f} s vs {b:.3f} s (2 nodes, no host list)",
             {"a": lm("poprun"), "b": lm("mpirun + hvd.init()")}),
        Goal("issue 26: Slurm allocation, poprun + popdist.init() < torchrun per node (srun, c10d)",
             "slurm-benchmark", at("ratios", "poprun_vs_torchrun"), 1.0, "<",
             "{a:.3f} s vs {b:.3f} s", {"a": lm("poprun"), "b": lm("torchrun per node (srun)")}),
    ]  # fmt: skip


def _others() -> list[Goal]:
    ratios = ("ratio",)
    goals = [
        Goal("issue 8: pipelined ≥ 1.5× sharded", "pipeline-benchmark", at(*ratios), 1.5, "≥",
             "{r:.2f}×", {"r": at(*ratios)}),
        Goal("issue 17: IPUStrategy 2 instances ≥ 1.2× Lightning DDP (gloo) 2 processes",
             "lightning-benchmark", at("ratio", "ipu_2_vs_ddp_2"), 1.2, "≥",
             "median of per-round ratios ({n:.0f} rounds); against DDP with 1 thread per process: "
             "{strict:.2f}; against the raw popdist_torch loop: {raw:.2f}",
             {"n": at("rounds"), "strict": at("ratio", "ipu_2_vs_ddp_2_one_thread"),
              "raw": at("ratio", "ipu_2_vs_raw_2")}),
        Goal("issue 17: IPUStrategy step ≤ 1.5× a raw popdist_torch call", "lightning-benchmark",
             at("ratio", "lightning_step_vs_raw_step"), 1.5, "≤",
             "median of per-round ratios ({n:.0f} rounds)", {"n": at("rounds")}),
    ]  # fmt: skip
    for shape, what in (("flood", "flood of 100-byte lines"), ("line", "single line")):
        goals.append(Goal(
            f"issue 18: poprun output throughput ≥ 0.8× bare mpirun, {{mb:.0f}} MB {what}",
            "output-throughput", at(shape, "ratio"), 0.8, "≥", "{a:.0f} vs {b:.0f} MB/s",
            {"mb": at("mb"),
             "a": lambda d, s=shape: d["mb"] / median_at(s, "stream_s", "poprun")(d),
             "b": lambda d, s=shape: d["mb"] / median_at(s, "stream_s", "mpirun")(d)}))  # fmt: skip
    return goals


def _real_models() -> list[Goal]:
    def md(case: str) -> Figure:
        return at("median", case)

    return [
        Goal("issue 30: tiny BERT training step, executor ≥ 0.9× plain torch", "real-models",
             at("ratio", "executor"), 0.9, "≥", "{a:.0f} vs {b:.0f} samples/s",
             {"a": md("executor step"), "b": md("plain torch step")}),
        Goal("issue 30: pipeline staged eagerly ≥ 0.9× staged by torch.fx", "real-models",
             at("ratio", "eager"), 0.9, "≥", "{a:.0f} vs {b:.0f} samples/s",
             {"a": md("eager-staged pipeline"), "b": md("fx-staged pipeline")}),
    ]  # fmt: skip


def _progress() -> list[Goal]:
    goals = []
    for model in ("mlp", "cnn"):

        def md(case: str, model: str = model) -> Figure:
            return at("models", model, "median", case)

        goals.append(Goal(
            f"issue 27: {model.upper()} training, 2 instances, progress reporting on ≥ 0.98× off",
            "progress-overhead", at("models", model, "ratio"), 0.98, "≥",
            "{a:.0f} vs {b:.0f} samples/s (median of the on/off ratios of {n:.0f} block pairs "
            "within launches)",
            {"a": md("on"), "b": md("off"),
             "n": lambda d: d["within"]["launches"] * d["within"]["pairs"]},
            optional=model != "mlp"))  # fmt: skip
    return goals


def _deterministic() -> list[Goal]:
    goals = []
    for split in ("2x3", "1x6"):

        def md(mode: str, split: str = split) -> Figure:
            return lambda d: statistics.median(d[split][mode])

        goals.append(Goal(
            f"issue 31: deterministic reduction / default, training throughput, {split} "
            "(stated, not judged)",
            "deterministic-reduction", at(split, "ratio"), None, "≥",
            "{a:.0f} vs {b:.0f} samples/s (median of {n:.0f} block-pair ratios within launches)",
            {"a": md("deterministic"), "b": md("default"), "n": lambda d, s=split: len(d[s]["ratios"])},
            optional=split != "2x3"))  # fmt: skip
    return goals


def _status_page() -> list[Goal]:
    return [
        Goal("issue 32: training with the status page open (a refresh a second) ≥ 0.99× closed",
             "status-page", at("ratio"), 0.99, "≥",
             "{a:.0f} vs {b:.0f} samples/s (median of the on/off ratios of {n:.0f} window pairs "
             "within one launch; the page's CPU alone: {c:.2%})",
             {"a": lambda d: statistics.median(d["rates"]["on"]),
              "b": lambda d: statistics.median(d["rates"]["off"]),
              "n": at("pairs"), "c": at("expected_cost")},
             optional=True),  # needs Chromium
    ]  # fmt: skip


GOALS: tuple[Goal, ...] = (
    *_launchers(),
    *_launch_overhead(),
    *_allreduce(),
    *_training(),
    *_torch_backend(),
    *_multihost(),
    *_slurm(),
    *_others(),
    *_progress(),
    *_deterministic(),
    *_status_page(),
    *_real_models(),
)
