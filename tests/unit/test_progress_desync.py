"""Issue 27's desync beyond one tensor: the parameters' broadcast compared as one call, and
instances that wait at one sequence number under different names (Horovod's desync)."""

from __future__ import annotations

from typing import Any

import pytest

from popdist import progress
from poprun.run.progress.board import ProgressBoard
from poprun.run.progress.diagnosis import desync_report, hang_report

pytestmark = pytest.mark.unit


class Tensor:
    """What the tracker reads of a tensor."""

    def __init__(self, *shape: int, dtype: str = "torch.float32") -> None:
        self.shape = shape
        self.dtype = dtype

    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    def element_size(self) -> int:
        return 4


class Backend:
    def broadcast_tensors(self, named: Any, *, root: int = 0) -> None:
        for _ in named:
            pass

    def broadcast_object(self, obj: Any, *, root: int = 0) -> Any:
        return obj


def test_the_parameters_broadcast_is_one_call_of_all_their_elements(
    tracker: progress.Tracker,
) -> None:
    backend = progress.instrument(Backend())
    backend.broadcast_tensors([("fc.weight", Tensor(8, 4)), ("fc.bias", Tensor(8))])
    _, kind, name, nbytes, shape, dtype, _, _ = tracker.recent[-1]
    assert (kind, name, nbytes, shape, str(dtype)) == (
        "broadcast_tensors", "2 tensors", 160, (40,), "torch.float32",
    )  # fmt: skip
    backend.broadcast_tensors([("a", Tensor(2)), ("b", Tensor(2, dtype="torch.int64"))])
    assert tracker.recent[-1][4:6] == ((4,), "mixed")
    seen: list[str] = []

    def pairs() -> Any:  # an iterator: the tracker must leave it whole for the backend
        seen.append("t")
        yield ("t", Tensor(3))

    backend.broadcast_tensors(pairs())
    assert seen == ["t"] and tracker.recent[-1][2:6] == ("", 0, (), "")
    backend.broadcast_object([Tensor(3)])  # only the root passes it: never compared by shape
    assert tracker.recent[-1][1] == "broadcast_object" and tracker.recent[-1][4] == ()


def _call(seq: int, name: str, elements: int, kind: str = "broadcast_tensors") -> list[Any]:
    return [seq, kind, name, 4 * elements, [elements], "float32", ["train.py", 9, "build"], 1.0]


def _record(instance: int, **extra: Any) -> dict[str, Any]:
    return {"instance": instance, "host": f"node{instance}", "pid": 100 + instance, **extra}


def test_parameters_of_different_sizes_are_a_desync_naming_both_sites() -> None:
    board = ProgressBoard(lambda: 50.0)
    board.update(_record(0, seq=2, recent=[_call(2, "4 tensors", 49)]))
    board.update(_record(1, seq=2, failed=_call(2, "4 tensors", 97)))
    desync = board.desync()
    assert desync is not None and desync.seq == 2
    report = desync_report(desync)
    assert "instance 0 (host node0): broadcast_tensors '4 tensors' shape (49,) float32" in report
    assert "instance 1 (host node1): broadcast_tensors '4 tensors' shape (97,) float32" in report
    assert report.count("called at train.py:9 in build") == 2


def test_waiting_at_one_sequence_number_under_different_names_is_said() -> None:
    board = ProgressBoard(lambda: 50.0)
    for instance in (0, 1):
        pending = _call(2, f"metric.{instance}", 2, kind="allreduce")
        board.update(_record(instance, seq=2, done=1, pending=pending))
    report = hang_report(board.snapshot(), [(0, "node0"), (1, "node1")], now=50.0, timeout=6)
    assert "every instance waits in collective #2, but under different names" in report
    assert "the collective itself does not finish" not in report
    board.update(_record(1, seq=2, done=1, pending=_call(2, "metric.0", 2, kind="allreduce")))
    report = hang_report(board.snapshot(), [(0, "node0"), (1, "node1")], now=50.0, timeout=6)
    assert "the collective itself does not finish" in report


def test_the_site_of_a_collective_is_its_line_each_time() -> None:
    """Sites are cached by code object and instruction: two calls from two lines of one
    function are two sites, a call repeated from one line is the same site."""
    from popdist import progress

    def wrapper() -> tuple[str, int, str]:  # as progress's own wrapper and _issue call it
        return (lambda: progress._site())()

    def user() -> list[tuple[str, int, str]]:
        first = wrapper()
        second = wrapper()
        return [first, second, *[wrapper() for _ in range(2)]]

    got = user()
    assert got[0][2] == got[1][2] == "user" and got[0][1] + 1 == got[1][1]
    assert got[2] == got[3] and got[2][1] == got[1][1] + 1


class Grads:
    """A backend whose allreduce the executor's gradient hooks would call."""

    def allreduce_async_(
        self, tensor: Any, *, average: bool = False, name: str | None = None
    ) -> int:
        return 1

    def wait(self, handle: int) -> None:
        return None


def test_collectives_inside_an_executor_call_carry_the_line_that_made_the_call(
    tracker: progress.Tracker,
) -> None:
    """The executor finds its caller's site once per call (``enter``): every collective the
    call issues, however deep in library frames, reports it; ``leave`` restores the outer
    site, and outside a call each collective finds its own again."""
    import sys

    backend = progress.instrument(Grads())

    def library_hook() -> None:  # as deep as a gradient hook: the site is not here
        backend.wait(backend.allreduce_async_(Tensor(4), name="grad.w"))

    def executor_call() -> None:  # what PoplarExecutor.__call__ does around its work
        outer = progress.enter(sys._getframe(1))
        try:
            library_hook()
            library_hook()
        finally:
            progress.leave(outer)

    def training_loop() -> int:
        executor_call()
        return sys._getframe().f_lineno - 1  # the line above

    line = training_loop()
    sites = {call[6] for call in tracker.recent}
    assert sites == {(__file__, line, "training_loop")}
    assert tracker.site is None
    backend.allreduce_async_(Tensor(4), name="grad.w")
    _, _, _, _, _, _, site, _ = tracker.recent[-1]
    assert site[2] == "test_collectives_inside_an_executor_call_carry_the_line_that_made_the_call"


def test_enter_and_leave_do_nothing_when_nothing_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setattr(progress, "tracker", None)
    assert progress.enter(sys._getframe()) is None
    progress.leave(None)
