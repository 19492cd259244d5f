"""A benchmark takes more rounds until its goals clear with margin, within its time budget."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from tests.support.jobs import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import charged_ratios, round_ratios, rounds_until_clear, trimmed_mean

pytestmark = pytest.mark.unit


class Clock:
    """Each round takes ``step`` seconds of this clock."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now


def _run(
    rounds: int,
    settle_after: int,
    max_rounds: int,
    budget: float,
    step: float = 10.0,
    at_least: int | None = None,
) -> list[int]:
    clock, ran = Clock(step), []

    def one_round(r: int) -> None:
        ran.append(r)
        clock.now += clock.step

    got = rounds_until_clear(
        one_round, rounds, settled=lambda: len(ran) >= settle_after, max_rounds=max_rounds,
        budget_s=budget, at_least=at_least, clock=clock,
    )  # fmt: skip
    assert got == len(ran)
    return ran


def test_the_asked_rounds_run_even_when_settled() -> None:
    assert _run(rounds=3, settle_after=0, max_rounds=10, budget=1000) == [0, 1, 2]


def test_more_rounds_until_settled() -> None:
    assert _run(rounds=3, settle_after=5, max_rounds=10, budget=1000) == [0, 1, 2, 3, 4]


def test_no_more_than_max_rounds() -> None:
    assert len(_run(rounds=3, settle_after=99, max_rounds=6, budget=1000)) == 6


def test_no_round_that_would_overrun_the_budget() -> None:
    # 10 s a round, 45 s budget: after 4 rounds (40 s) a fifth would end at 50 s
    assert len(_run(rounds=3, settle_after=99, max_rounds=20, budget=45)) == 4
    # the asked rounds run whatever the budget
    assert len(_run(rounds=3, settle_after=99, max_rounds=20, budget=5)) == 3


def test_at_least_bounds_the_asked_rounds_by_the_budget_too() -> None:
    # a slower machine: 5 rounds asked, 10 s each, 35 s of budget: 3 (at least), no more
    assert len(_run(rounds=5, settle_after=0, max_rounds=5, budget=35, at_least=3)) == 3
    # where they fit, all 5 run
    assert len(_run(rounds=5, settle_after=0, max_rounds=5, budget=1000, at_least=3)) == 5
    # at least 3 even with no budget at all
    assert len(_run(rounds=5, settle_after=0, max_rounds=5, budget=0, at_least=3)) == 3


def test_interleave_goes_on_until_the_samples_clear() -> None:
    from _common import interleave

    calls: list[str] = []

    def case(name: str, value: float) -> Callable[[], float]:
        def run() -> float:
            calls.append(name)
            return value

        return run

    got = interleave(
        {"a": case("a", 2.0), "b": case("b", 1.0)}, 2,
        until=lambda samples: len(samples["a"]) >= 5, max_rounds=9, budget_s=60,
    )  # fmt: skip
    assert len(got["a"].samples) == len(got["b"].samples) == 5
    assert calls[:4] == ["a", "b", "b", "a"]  # rotating order, round by round
    plain = interleave({"a": case("a", 2.0)}, 3)
    assert len(plain["a"].samples) == 3  # without ``until``: the rounds asked for


def test_a_round_is_its_pairs_mean_on_over_mean_off_and_a_partial_round_is_left_out() -> None:
    on = [10.0, 12.0, 9.0, 11.0, 7.0]
    off = [10.0, 10.0, 10.0, 10.0, 7.0]
    assert round_ratios(on, off, 2) == [pytest.approx(1.1), pytest.approx(1.0)]
    assert round_ratios(on, off, 1) == [pytest.approx(a / b) for a, b in zip(on, off, strict=True)]
    assert round_ratios(on[:1], off[:1], 2) == []


def test_rounds_of_pairs_shrink_the_spread_of_noisy_pairs() -> None:
    """Pairs whose noise alternates around one true ratio: each round of several sees the
    truth, each pair alone does not."""
    from goals import spread

    on = [0.95 + 0.05 * (k % 2) * 2 for k in range(12)]  # 0.95, 1.05, 0.95, ...
    off = [1.0] * 12
    pairs = [a / b for a, b in zip(on, off, strict=True)]
    rounds = round_ratios(on, off, 2)
    assert rounds == [pytest.approx(1.0)] * 6
    round_spread, pair_spread = spread(rounds), spread(pairs)
    assert round_spread is not None and pair_spread is not None
    assert round_spread == pytest.approx(0.0) and pair_spread > 0.05


def test_an_ab_round_is_throughput_on_over_off_with_the_threads_share_charged_to_on() -> None:
    # Round 0: the steps took 2 % longer on, the thread nothing; round 1: equal times, the
    # thread 1 % of the round; round 2: on faster.
    got = charged_ratios([1.02, 1.0, 0.99], [1.0, 1.0, 1.0], [0.0, 0.01, 0.0])
    assert got == [pytest.approx(1 / 1.02), pytest.approx(0.99), pytest.approx(1 / 0.99)]
    with pytest.raises(ValueError):
        charged_ratios([1.0, 1.0], [1.0], [0.0, 0.0])  # rounds that do not pair up


def test_a_trimmed_mean_drops_each_tail_and_moves_with_a_cost_on_every_step() -> None:
    steps = [2.0] * 90 + [1.9] * 5 + [40.0] * 5  # the slowest and fastest 5 %: a spike, a dip
    assert trimmed_mean(steps) == pytest.approx(2.0)
    assert trimmed_mean([s + 0.02 for s in steps]) == pytest.approx(2.02)  # 1 % every step
    assert sum(steps) / len(steps) > 3.8  # the plain mean: the spike's
    assert trimmed_mean([3.0]) == 3.0 and trimmed_mean([1.0, 5.0], cut=0.5) == 3.0
    with pytest.raises(ValueError):
        trimmed_mean([])
