"""The collectives seam: the interface's shared logic, the reducer on it, who imports a backend."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import popdist_torch
from popdist import collectives, progress
from popdist.collectives import CollectiveError
from popdist.collectives.base import Collectives
from popdist.env import PopdistError
from popdist_torch.execution.reducer import GradientReducer, broadcast_state
from tests.support.jobs import ROOT


class Loopback(Collectives):
    """A fake world of ``size`` ranks run one after the other; rank ``root`` runs first.

    Broadcasts store the root's tensors by name and copy them into the others';
    allreduces are recorded (and count as done when waited for).
    """

    name = "loopback"

    def __init__(self, rank: int, store: dict[str, torch.Tensor], size: int = 2) -> None:
        self._rank, self._size, self.store = rank, size, store
        self.launched: list[tuple[str | None, bool]] = []
        self.waited: list[int] = []

    def start(self) -> None:
        pass

    def is_started(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def allreduce_async_(
        self, tensor: torch.Tensor, *, average: bool = False, name: str | None = None
    ) -> int:
        self.launched.append((name, average))
        return len(self.launched) - 1

    def wait(self, handle: int) -> None:
        self.waited.append(handle)

    def broadcast_(
        self, tensor: torch.Tensor, *, root: int = 0, name: str | None = None
    ) -> torch.Tensor:
        assert name is not None
        if self._rank == root:
            self.store[name] = tensor.clone()
        else:
            tensor.copy_(self.store[name])
        return tensor

    def allgather(self, tensor: torch.Tensor, *, name: str | None = None) -> torch.Tensor:
        return torch.cat([tensor] * self._size)

    def barrier(self) -> None:
        pass


def _trained_adam(seed: int) -> tuple[nn.Linear, torch.optim.Adam]:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    return model, opt


def test_default_broadcast_optimizer_state_gives_the_roots_state_to_the_others() -> None:
    store: dict[str, torch.Tensor] = {}
    root_model, root_opt = _trained_adam(0)
    other_model = nn.Linear(3, 2)
    other_opt = torch.optim.Adam(other_model.parameters(), lr=0.5)
    broadcast_state(Loopback(0, store), root_model, root_opt, buffers=True)
    broadcast_state(Loopback(1, store), other_model, other_opt, buffers=True)
    assert torch.equal(other_model.weight, root_model.weight)
    assert other_opt.param_groups[0]["lr"] == 0.1
    got = other_opt.state_dict()["state"][0]
    want = root_opt.state_dict()["state"][0]
    assert torch.equal(got["exp_avg"], want["exp_avg"]) and int(got["step"]) == 1


def test_broadcast_state_leaves_an_empty_optimizer_state_empty() -> None:
    store: dict[str, torch.Tensor] = {}
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    other = Loopback(1, store)
    broadcast_state(Loopback(0, store), model, opt, buffers=False)
    broadcast_state(other, nn.Linear(3, 2), torch.optim.Adam(model.parameters()), buffers=False)
    assert "popdist_torch.optimizer_state" not in store  # has_state said no


def test_reducer_launches_each_gradient_once_when_armed_and_waits_for_all() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1), nn.Linear(1, 1))
    model[2].requires_grad_(False)
    backend = Loopback(0, {})
    reducer = GradientReducer(backend, model.named_parameters(), average=True)
    model(torch.ones(2, 3)).sum().backward()  # not armed: an intermediate step
    assert backend.launched == []
    reducer.arm()
    model(torch.ones(2, 3)).sum().backward()
    reducer.finish()
    names = sorted(name for name, _ in backend.launched)
    assert names == [
        f"popdist_torch.grad.{n}" for n in ("0.bias", "0.weight", "1.bias", "1.weight")
    ]
    assert all(average for _, average in backend.launched)
    assert sorted(backend.waited) == [0, 1, 2, 3]


def test_under_progress_an_update_s_gradients_are_one_record(tracker: progress.Tracker) -> None:
    """One group a weight update (issue 33): as many sequence numbers as gradients, one
    entry naming the first and how many more, all their elements as one flat shape; the
    gradients go through the backend's own methods, not the per-call wrappers."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    backend = progress.instrument(Loopback(0, {}))
    reducer = GradientReducer(backend, model.named_parameters(), average=True)
    for update in (1, 2):
        reducer.arm()
        model(torch.ones(2, 3)).sum().backward()
        reducer.finish()
        assert (tracker.seq, tracker.done) == (4 * update, 4 * update)
        assert len(tracker.recent) == update and not tracker.inflight  # no per-call record
    seq, kind, name, nbytes, shape, dtype, site, _ = tracker.recent[-1]
    assert (seq, kind, name) == (5, "allreduce", "popdist_torch.grad.0.weight and 3 more")
    assert (shape, nbytes, dtype) == ((16,), 64, torch.float32) and tracker.bytes_reduced == 128
    assert site[2] == "test_under_progress_an_update_s_gradients_are_one_record"
    assert tracker.blocked is None and tracker.wait_s > 0
    assert len(backend.launched) == 8 and len(backend.waited) == 8


class FailingWait(Loopback):
    def wait(self, handle: int) -> None:
        raise RuntimeError("Horovod has been shut down")


def test_a_failed_gradient_wait_is_the_group_s_failure(
    tracker: progress.Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[Any] = []
    monkeypatch.setattr("atexit.register", registered.append)
    model = nn.Linear(3, 2)
    reducer = GradientReducer(
        progress.instrument(FailingWait(0, {})), model.named_parameters(), average=False
    )
    reducer.arm()
    model(torch.ones(2, 3)).sum().backward()
    with pytest.raises(RuntimeError, match="shut down"):
        reducer.finish()
    assert (
        tracker.failed is not None and tracker.failed[2] == "popdist_torch.grad.weight and 1 more"
    )
    assert tracker.failure == "RuntimeError: Horovod has been shut down"
    assert registered == [progress._end_after_failure] and tracker.blocked is None
    assert (tracker.seq, tracker.done) == (2, 0)


def test_a_reducer_without_trainable_parameters_records_nothing(tracker: progress.Tracker) -> None:
    model = nn.Linear(3, 2).requires_grad_(False)
    reducer = GradientReducer(Loopback(0, {}), model.named_parameters(), average=False)
    reducer.reduce_all()
    assert (tracker.seq, tracker.done, len(tracker.recent)) == (0, 0, 0)
    one = progress.Group("allreduce", ["w"], [torch.zeros(3)])
    assert (one.name, one.count, one.shape, one.nbytes) == ("w", 1, (3,), 12)


def test_without_progress_the_reducer_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "tracker", None)
    model = nn.Linear(3, 2)
    backend = Loopback(0, {})
    reducer = GradientReducer(backend, model.named_parameters(), average=False)
    reducer.arm()
    model(torch.ones(2, 3)).sum().backward()
    reducer.finish()
    assert sorted(backend.waited) == [0, 1] and "_progress_plain" not in vars(backend)


def test_disarm_stops_the_hooks_until_the_next_arm() -> None:
    model = nn.Linear(3, 1)
    backend = Loopback(0, {})
    reducer = GradientReducer(backend, model.named_parameters(), average=False)
    reducer.arm()
    reducer.disarm()
    model(torch.ones(2, 3)).sum().backward()
    assert backend.launched == []
    reducer.remove()


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(CollectiveError, match=r"backend 'mpi5' is unknown: expected one of"):
        collectives.spec("mpi5")
    assert issubclass(CollectiveError, PopdistError)
    assert issubclass(CollectiveError, RuntimeError)
    # popdist_torch's users still find it where they did
    assert popdist_torch.CollectiveError is CollectiveError
    assert popdist_torch.errors.CollectiveError is CollectiveError


def test_only_the_backend_modules_import_a_collectives_library() -> None:
    pattern = re.compile(r"^\s*(import|from)\s+(horovod|torch\.distributed)\b", re.MULTILINE)
    seam = Path("popdist/collectives")
    backends = {seam / "horovod.py", seam / "torchdist.py"}
    importers = {
        path.relative_to(ROOT)
        for package in ("popdist", "popdist_torch", "popdist_lightning", "poprun")
        for path in (ROOT / package).rglob("*.py")
        if pattern.search(path.read_text())
    }
    assert importers == backends


def test_nap_until_naps_a_growing_fraction_of_the_wait_and_stops_when_done() -> None:
    from popdist.collectives.horovod import MAX_NAP_S, MIN_NAP_S, NAP_FRACTION, nap_until

    now = [0.0]
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        now[0] += seconds

    nap_until(lambda: now[0] >= 0.5, clock=lambda: now[0], sleep=sleep)
    assert naps[0] == MIN_NAP_S
    assert naps == sorted(naps)
    assert max(naps) == MAX_NAP_S
    assert all(
        n <= max(MIN_NAP_S, (sum(naps[:i]) * NAP_FRACTION)) + 1e-12 for i, n in enumerate(naps)
    )
    assert now[0] - 0.5 < MAX_NAP_S  # the overshoot is one nap at most
    assert len(naps) < 400  # Horovod's own loop wakes about 9 000 times in 0.5 s

    naps.clear()
    nap_until(lambda: True, clock=lambda: now[0], sleep=sleep)
    assert naps == []


def test_across_hosts_horovod_waits_with_naps_only_for_long_allreduces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from popdist.collectives import horovod

    calls: list[tuple[str, int]] = []

    class FakeHvd:
        Sum, Average = "sum", "average"
        handles = iter(range(100))

        def allreduce_async_(self, tensor: torch.Tensor, name: str, op: str) -> int:
            return next(self.handles)

        def poll(self, handle: int) -> bool:
            calls.append(("poll", handle))
            return sum(1 for c in calls if c == ("poll", handle)) > 2

        def synchronize(self, handle: int) -> None:
            calls.append(("synchronize", handle))

    monkeypatch.setattr(horovod.time, "sleep", lambda s: calls.append(("sleep", 0)))
    backend = horovod.HorovodCollectives()
    backend._hvd = FakeHvd()  # type: ignore[assignment]
    backend._long_wait_bytes = horovod.LONG_WAIT_BYTES  # as start() sets it across hosts
    small = backend.allreduce_async_(torch.zeros(4))
    long = backend.allreduce_async_(torch.zeros(horovod.LONG_WAIT_BYTES // 4))
    backend.wait(small)
    assert calls == [("synchronize", small)]
    calls.clear()
    backend.wait(long)
    assert calls == [
        ("poll", long),
        ("sleep", 0),
        ("poll", long),
        ("sleep", 0),
        ("poll", long),
        ("synchronize", long),
    ]


@pytest.mark.parametrize("local", [1, 2])
def test_horovod_naps_only_when_the_instances_span_hosts(
    monkeypatch: pytest.MonkeyPatch, local: int
) -> None:
    from popdist.collectives import horovod
    from popdist.env import RunView

    class FakeHvd:
        Sum = Average = "op"
        handles = iter(range(100))

        def init(self) -> None: ...

        def is_initialized(self) -> bool:
            return False

        def allreduce_async_(self, tensor: torch.Tensor, name: str, op: str) -> int:
            return next(self.handles)

    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "1")  # start() sets it only when unset
    monkeypatch.setenv(horovod.WAIT_SPIN_VARIABLE, "1000")
    monkeypatch.setattr(horovod, "_import_horovod", FakeHvd)
    monkeypatch.setattr(
        horovod, "read_run", lambda: RunView(num_instances=2, num_local_instances=local)
    )
    backend = horovod.HorovodCollectives()
    backend.start()
    below = backend.allreduce_async_(torch.zeros(horovod.LONG_WAIT_BYTES // 4 - 1))
    at = backend.allreduce_async_(torch.zeros(horovod.LONG_WAIT_BYTES // 4))
    big = backend.allreduce_async_(torch.zeros(8 * horovod.LONG_WAIT_BYTES // 4))
    assert below not in backend._long_waits
    assert backend._long_waits == ({at, big} if local == 1 else set())


@pytest.mark.parametrize(("local", "cores", "spin"), [(1, 2, None), (2, 2, "0"), (2, 4, None)])
def test_horovod_blocks_at_once_where_threads_outnumber_cores(
    monkeypatch: pytest.MonkeyPatch, local: int, cores: int, spin: str | None
) -> None:
    from popdist.collectives import horovod
    from popdist.env import RunView

    seen: dict[str, str | None] = {}

    class FakeHvd:
        def init(self) -> None:  # what Horovod reads when it starts
            seen["spin"] = os.environ.get(horovod.WAIT_SPIN_VARIABLE)

        def is_initialized(self) -> bool:
            return False

    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "1")
    monkeypatch.setenv(horovod.WAIT_SPIN_VARIABLE, "")  # recorded, so start()'s value is undone
    monkeypatch.delenv(horovod.WAIT_SPIN_VARIABLE)
    monkeypatch.setattr(horovod, "_import_horovod", FakeHvd)
    monkeypatch.setattr(horovod.os, "sched_getaffinity", lambda _: set(range(cores)))
    monkeypatch.setattr(
        horovod, "read_run", lambda: RunView(num_instances=2, num_local_instances=local)
    )
    horovod.HorovodCollectives().start()
    assert seen["spin"] == spin
    monkeypatch.setenv(horovod.WAIT_SPIN_VARIABLE, "250")  # the user's own value wins
    horovod.HorovodCollectives().start()
    assert seen["spin"] == "250"
