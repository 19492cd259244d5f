"""A benchmark takes more rounds until its goals clear with margin, within its time budget."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from tests.support.jobs import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import rounds_until_clear

pytestmark = pytest.mark.unit


class Clock:
    """Each round takes ``step`` seconds of this clock."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now


def _run(
    rounds: int, settle_after: int, max_rounds: int, budget: float, step: float = 10.0
) -> list[int]:
    clock, ran = Clock(step), []

    def one_round(r: int) -> None:
        ran.append(r)
        clock.now += clock.step

    got = rounds_until_clear(
        one_round, rounds, settled=lambda: len(ran) >= settle_after, max_rounds=max_rounds,
        budget_s=budget, clock=clock,
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
