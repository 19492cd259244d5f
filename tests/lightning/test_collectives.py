"""Lightning's collectives go through the run's popdist backend (either one), not Horovod."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from popdist_lightning import collectives
from popdist_lightning.errors import IPUStrategyError


class TwoRanks:
    """This rank holds ``t``, the other ``t + 1``: what each collective would return."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def size(self) -> int:
        return 2

    def allreduce_(self, tensor: torch.Tensor, **_: Any) -> torch.Tensor:
        self.calls.append("allreduce_")
        return tensor.mul_(2).add_(1)

    def allgather(self, tensor: torch.Tensor, **_: Any) -> torch.Tensor:
        self.calls.append("allgather")
        return torch.cat([tensor, tensor + 1])

    def broadcast_object(self, obj: Any, *, root: int) -> Any:
        self.calls.append(f"broadcast_object root={root}")
        return ("from", root)

    def barrier(self) -> None:
        self.calls.append("barrier")


@pytest.fixture
def two(monkeypatch: pytest.MonkeyPatch) -> TwoRanks:
    fake = TwoRanks()
    monkeypatch.setattr(collectives, "_collectives", lambda: fake)
    return fake


def test_reductions_over_two_instances(two: TwoRanks) -> None:
    t = torch.tensor([1.0, 4.0])
    assert collectives.reduce(t, "sum").tolist() == [3.0, 9.0]
    assert collectives.reduce(t, "mean").tolist() == [1.5, 4.5]
    assert collectives.reduce(t).tolist() == [1.5, 4.5]
    assert collectives.reduce(t, "max").tolist() == [2.0, 5.0]
    assert collectives.reduce(t, "min").tolist() == [1.0, 4.0]
    assert t.tolist() == [1.0, 4.0]  # the caller's tensor is left alone
    assert collectives.reduce_boolean_decision(True, all=False)
    assert collectives.all_gather(t).shape == (2, 2)
    assert collectives.broadcast({"x": 1}, src=1) == ("from", 1)
    collectives.barrier()
    assert two.calls[-2:] == ["broadcast_object root=1", "barrier"]


def test_an_unknown_reduction_is_named() -> None:
    with pytest.raises(IPUStrategyError, match=r"reduce_op='prod'.*avg, max, mean, min, sum"):
        collectives.reduce(torch.ones(1), "prod")


def test_one_instance_uses_the_local_backend_and_starts_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A single instance goes through the same code, on popdist's null backend."""
    import popdist
    from popdist import env

    for name in (*env.ALL, env.OMPI_SIZE, env.OMPI_RANK):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)  # starting Horovod would fail
    assert collectives._collectives().name == popdist.collectives.LOCAL
    t = torch.ones(2)
    assert torch.equal(collectives.reduce(t, "sum"), t)
    assert collectives.reduce(t, "mean").tolist() == [1.0, 1.0]
    assert collectives.reduce(t, "max").tolist() == [1.0, 1.0]
    assert t.tolist() == [1.0, 1.0]  # the caller's tensor is left alone
    assert collectives.broadcast("x") == "x"
    assert collectives.all_gather(t).shape == (1, 2)
    assert collectives.reduce_boolean_decision(True) and not collectives.reduce_boolean_decision(
        False
    )
    collectives.barrier()
    assert not popdist.isBackendInitialized()
