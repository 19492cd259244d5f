"""The benchmarks' goals are data: each record is judged against results, none is lost."""

from __future__ import annotations

import sys

import pytest

from tests.support.jobs import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import goals
import run_all
from goals import Goal, at, difference, evaluate, ratio

pytestmark = pytest.mark.unit

RESULTS = {"bench": {"a": {"median": 2.0}, "b": {"median": 1.0}, "flag": False}}


def _goal(threshold: float | None, direction: str, **kw: object) -> Goal:
    figure = ratio(at("a", "median"), at("b", "median"))
    fields = {"a": at("a", "median"), "b": at("b", "median")}
    return Goal(
        "a / b {a:.1f}", "bench", figure, threshold, direction, "{a:.1f} vs {b:.1f}", fields, **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("threshold", "direction", "met"),
    [
        (1.5, "≥", True),
        (2.5, "≥", False),
        (2.0, "≤", True),
        (1.9, "≤", False),
        (2.0, "<", False),
        (2.1, "<", True),
    ],
)
def test_each_direction_is_judged(threshold: float, direction: str, met: bool) -> None:
    verdict = evaluate(_goal(threshold, direction), RESULTS)
    assert verdict is not None
    assert (verdict.value, verdict.met) == (2.0, met)
    assert verdict.row() == ["a / b 2.0", "2.0 vs 1.0", "2.00", "**yes**" if met else "**no**"]


def test_without_a_threshold_the_figure_is_reported_not_judged() -> None:
    verdict = evaluate(_goal(None, "≥"), RESULTS)
    assert verdict is not None and verdict.met is None and verdict.row()[3] == "—"


def test_a_missing_figure_is_not_measured_or_left_out_when_optional() -> None:
    absent = evaluate(_goal(1.0, "≥"), {})
    assert absent is not None and absent.row() == ["a / b ?", "not measured", "—", "—"]
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
    judged = [r for r in rows if r[3] != "—"]
    assert len(judged) >= 40
    assert all(r[1] != "not measured" for r in judged)
