"""The benchmarks' goals are data: each record is judged against results, none is lost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.jobs import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import goals
import run_all
from goals import Goal, at, clears, difference, evaluate, listed, per_round, ratio, spread

pytestmark = pytest.mark.unit

#: Four interleaved rounds of a and b whose per-round ratios are 1.9, 2.0, 2.0, 2.1.
RESULTS = {
    "bench": {
        "a": {"median": 2.0, "samples": [3.8, 4.0, 2.0, 2.1]},
        "b": {"median": 1.0, "samples": [2.0, 2.0, 1.0, 1.0]},
        "flag": False,
    }
}
EACH = per_round(listed("a", "samples"), listed("b", "samples"))


def _goal(threshold: float | None, direction: str, **kw: object) -> Goal:
    figure = ratio(at("a", "median"), at("b", "median"))
    fields = {"a": at("a", "median"), "b": at("b", "median")}
    kw.setdefault("rounds", EACH)
    return Goal(
        "a / b {a:.1f}", "bench", figure, threshold, direction, "{a:.1f} vs {b:.1f}", fields, **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("threshold", "direction", "met"),
    [
        (1.5, "≥", True),
        (2.5, "≥", False),
        (2.1, "≤", True),
        (1.9, "≤", False),
        (2.0, "<", False),
        (2.2, "<", True),
    ],
)
def test_each_direction_is_judged(threshold: float, direction: str, met: bool) -> None:
    verdict = evaluate(_goal(threshold, direction), RESULTS)
    assert verdict is not None
    assert (verdict.value, verdict.met) == (2.0, met)
    assert verdict.row()[:3] == ["a / b 2.0", "2.0 vs 1.0", "2.00"]
    assert verdict.row()[5] in (("**yes**",) if met else ("**no**", "**no** (no margin)"))


def test_the_spread_is_the_iqr_from_four_rounds_and_the_range_below() -> None:
    assert spread([1.9, 2.0, 2.0, 2.1]) == pytest.approx(0.15)  # quartiles 1.925, 2.075
    assert spread([0.78, 0.99]) == pytest.approx(0.21)
    assert spread([1.0]) is None and spread([]) is None


def test_a_goal_is_met_only_with_a_margin_of_half_the_spread() -> None:
    # per-round median 2.0, IQR 0.15: it must clear the goal by 0.075
    at_edge = evaluate(_goal(1.95, "≥"), RESULTS)
    clear = evaluate(_goal(1.9, "≥"), RESULTS)
    assert at_edge is not None and clear is not None
    assert at_edge.passed and at_edge.met is False
    assert at_edge.row()[3:] == ["0.150 (n=4)", "+0.050", "**no** (no margin)"]
    assert clear.met is True and clear.row()[3:] == ["0.150 (n=4)", "+0.100", "**yes**"]
    assert clears([1.9, 2.0, 2.0, 2.1], 1.9, "≥") and not clears([1.9, 2.0, 2.0, 2.1], 1.95, "≥")
    assert clears([0.5, 0.52], 0.6, "≤") and not clears([0.5, 0.7], 0.6, "≤")


def test_a_bound_is_judged_on_its_worst_round_without_a_margin() -> None:
    # per-round ratios 1.9, 2.0, 2.0, 2.1: every round must keep the bound
    kept = evaluate(_goal(2.1, "≤", bound=True), RESULTS)
    broken = evaluate(_goal(2.05, "≤", bound=True), RESULTS)
    floor = evaluate(_goal(1.9, "≥", bound=True), RESULTS)
    assert kept is not None and broken is not None and floor is not None
    assert (kept.value, kept.met) == (pytest.approx(2.1), True)  # at the bound, no spread to clear
    assert (broken.value, broken.passed, broken.met) == (pytest.approx(2.1), False, False)
    assert (floor.value, floor.met) == (pytest.approx(1.9), True)
    assert evaluate(_goal(2.1, "≤", bound=True, rounds=None), RESULTS).met is False  # type: ignore[union-attr]


def test_without_per_round_figures_a_goal_cannot_be_met() -> None:
    verdict = evaluate(_goal(1.0, "≥", rounds=None), RESULTS)
    assert verdict is not None and verdict.value == 2.0 and verdict.met is False
    assert verdict.row()[3:] == ["—", "—", "**no** (no margin)"]


def test_a_record_with_the_figure_only_is_judged_without_its_details() -> None:
    bare = {"bench": {"a": {"median": 2.0}, "b": {"median": 1.0}}}
    goal = Goal("a / b {a:.1f}", "bench", ratio(at("a", "median"), at("b", "median")), 1.0, "≥",
                "{a:.1f} vs {c:.1f}", {"a": at("a", "median"), "c": at("c")})  # fmt: skip
    verdict = evaluate(goal, bare)
    assert verdict is not None and verdict.value == 2.0
    assert verdict.row()[:2] == ["a / b ?", "details not recorded"]


def test_without_a_threshold_the_figure_is_reported_not_judged() -> None:
    verdict = evaluate(_goal(None, "≥"), RESULTS)
    assert verdict is not None and verdict.met is None and verdict.row()[5] == "—"


def test_a_missing_figure_is_not_measured_or_left_out_when_optional() -> None:
    absent = evaluate(_goal(1.0, "≥"), {})
    assert absent is not None
    assert absent.row() == ["a / b ?", "not measured", "—", "—", "—", "—"]
    assert evaluate(_goal(1.0, "≥", optional=True), {}) is None
    lacking = {"bench": {"a": {"median": 2.0}}}
    assert evaluate(_goal(1.0, "≥", missing="needs root"), lacking).row()[1] == "needs root"  # type: ignore[union-attr]


def test_a_further_condition_can_fail_a_goal() -> None:
    verdict = evaluate(_goal(1.0, "≥", also=lambda data: data["flag"]), RESULTS)
    assert verdict is not None and verdict.met is False


def test_difference_and_unknown_direction() -> None:
    assert difference(at("a", "median"), at("b", "median"))(RESULTS["bench"]) == 1.0
    with pytest.raises(ValueError, match="direction"):
        Goal("x", "bench", at("a"), 1.0, "≈")


def test_every_goal_reads_a_benchmark_run_all_writes() -> None:
    written = {stem for _, _, stem in run_all.benches(None).values()} | {"training", "gpu-check"}
    assert {g.source for g in goals.GOALS} <= written
    assert len({g.name for g in goals.GOALS}) == len(goals.GOALS)


def test_the_committed_results_give_every_goal_a_row() -> None:
    """Each record of the table is judged on the committed docs/*.json: none is dropped."""
    rows = goals.headline(goals.GOALS, run_all.results())
    judged = [r for r in rows if r[5] != "—"]
    assert len(judged) >= 40
    assert all(r[1] != "not measured" for r in judged)


def test_every_judged_goal_has_per_round_figures_in_the_committed_results() -> None:
    """Margin needs a spread: every goal with a threshold reads its figure round by round."""
    found = run_all.results()
    for goal in goals.GOALS:
        verdict = evaluate(goal, found)
        if verdict is None or verdict.value is None or goal.threshold is None:
            continue
        assert verdict.spread is not None, goal.name


def test_the_report_keeps_every_cpu_and_marks_transcribed_figures() -> None:
    cpus = run_all.measured_cpus()
    assert "AMD EPYC" in cpus and cpus["AMD EPYC"] == ""
    transcribed = [cpu for cpu, note in cpus.items() if note]
    assert transcribed and all("transcribed" in cpu for cpu in transcribed)
    rows = run_all.per_cpu_rows(cpus)
    xeon = list(cpus).index(transcribed[0]) + 1
    row = next(r for r in rows if "16 MB, 4 KB pages" in r[0])
    assert row[xeon].startswith("0.86")


def test_results_are_kept_per_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import _common

    monkeypatch.setattr(_common, "DOCS", tmp_path)
    (tmp_path / "bench.json").write_text('{"ratio": 0.9}')  # a record from before
    assert _common.load_results("bench") == {"ratio": 0.9}
    assert _common.recorded_cpus("bench") == {_common.LEGACY_CPU: ""}
    _common.save_results("bench", {"ratio": 1.1}, cpu="Intel Xeon X")
    _common.save_results("bench", {"ratio": 1.2}, cpu=_common.LEGACY_CPU)
    assert _common.load_results("bench") == {"ratio": 1.2}  # the latest run
    assert _common.load_results("bench", "Intel Xeon X") == {"ratio": 1.1}  # kept
    assert set(_common.recorded_cpus("bench")) == {_common.LEGACY_CPU, "Intel Xeon X"}
    assert _common.load_results("absent") is None


def test_a_generic_cpu_name_is_keyed_with_its_family_and_model() -> None:
    import _common

    masked = "processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n\n"
    other = masked.replace(": 1\n", ": 17\n", 1)
    assert _common.cpu_model(masked) == "AMD EPYC (family 25, model 1)"
    assert _common.cpu_model(other) == "AMD EPYC (family 25, model 17)"  # another generation
    named = masked.replace("AMD EPYC", "AMD EPYC 7763 64-Core Processor")
    assert _common.cpu_model(named) == "AMD EPYC 7763 64-Core Processor"  # names its part
    second = masked + "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: X\n"
    assert _common.cpu_model(second) == "AMD EPYC (family 25, model 1)"  # the first CPU's


def test_the_headline_names_whose_records_it_judges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_all, "cpu_model", lambda: "CPU A")
    latest = {"allreduce": "CPU A", "launchers": "CPU B"}
    monkeypatch.setattr(run_all, "latest_cpu", lambda stem: latest.get(stem))
    said = run_all.latest_runs_on()
    assert "CPU A (this machine): allreduce" in said and "CPU B: launchers" in said
    latest["launchers"] = "CPU A"
    assert run_all.latest_runs_on() == "on CPU A"


def test_a_failed_further_condition_is_no_not_no_margin() -> None:
    verdict = evaluate(_goal(1.0, "≥", also=lambda data: False), RESULTS)
    assert verdict is not None and verdict.row()[5] == "**no**"


def test_the_gpu_goal_is_judged_but_counted_apart_from_make_bench() -> None:
    """``make gpu-check`` runs on another machine: its goal has a row and is judged, but the
    count of ``make bench``'s goals leaves it out and names it in a sentence of its own."""
    found = run_all.results()
    met, judged, apart = run_all.tally(found)
    verdicts = [v for g in goals.GOALS if (v := goals.evaluate(g, found)) is not None]
    in_bench = [v for v in verdicts if v.goal.source != "gpu-check" and v.met is not None]
    assert (met, judged) == (sum(bool(v.met) for v in in_bench), len(in_bench))
    gpu = [v for v in verdicts if v.goal.source == "gpu-check"]
    assert len(gpu) == 1
    if gpu[0].met is None:
        assert apart == ""
    else:
        assert "make gpu-check" in apart and "issue 19: GPU" in apart


def test_a_cost_at_the_noise_floor_is_judged_by_its_cpu_with_the_ab_beside_it() -> None:
    """Issue 53: the CPU share (per cent, with margin) decides; the A/B must stay ≥ 0.98."""
    from goals import noise_floor

    def results(shares: list[float], ab: list[float]) -> dict[str, object]:
        return {"bench": {"share": shares, "ab": ab}}

    goal = noise_floor("a cost", "bench", listed("share"), listed("ab"),
                       "{share:.2%}; A/B {ab:.3f} (spread {ab_spread:.3f}, n={ab_n})")  # fmt: skip
    cheap = evaluate(goal, results([0.004, 0.005, 0.006, 0.005], [0.97, 1.0, 0.99, 1.01]))
    assert cheap is not None and cheap.met is True and cheap.value == pytest.approx(0.5)
    assert cheap.detail == "0.50%; A/B 0.995 (spread 0.032, n=4)"
    slow_ab = evaluate(goal, results([0.004, 0.005, 0.006, 0.005], [0.96, 0.97, 0.97, 0.99]))
    assert slow_ab is not None and slow_ab.passed is False  # the A/B fell below 0.98
    dear = evaluate(goal, results([0.009, 0.010, 0.011, 0.012], [1.0, 1.0, 1.0, 1.0]))
    assert dear is not None and dear.met is False
