"""The torch.distributed backend's start-up: backend choice, rendezvous address, devices."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from popdist import env
from popdist.collectives import torchdist as torch_distributed
from popdist.env import PopdistError, RunView, read_backend

pytestmark = pytest.mark.unit


def test_backend_defaults_to_auto_and_follows_the_contract_variable() -> None:
    assert read_backend({}) == "auto"
    assert read_backend({env.BACKEND: "torch"}) == "torch"
    assert read_backend({env.BACKEND: " Torch "}) == "torch"
    assert read_backend({env.BACKEND: ""}) == "auto"


def test_an_explicit_backend_wins_over_the_environment() -> None:
    assert read_backend({env.BACKEND: "torch"}, requested="horovod") == "horovod"
    assert read_backend({env.BACKEND: "horovod"}, requested="torch") == "torch"


@pytest.mark.parametrize(
    ("environ", "requested", "named"),
    [
        ({env.BACKEND: "nccl"}, None, "POPDIST_BACKEND='nccl'"),
        ({}, "mpi", "popdist.init(backend=...)='mpi'"),
    ],
)
def test_an_unknown_backend_names_the_value_and_the_choices(
    environ: dict[str, str], requested: str | None, named: str
) -> None:
    with pytest.raises(PopdistError) as info:
        read_backend(environ, requested=requested)
    assert named in str(info.value)
    assert "auto, horovod, torch" in str(info.value)


def _run(**fields: object) -> RunView:
    return RunView(from_poprun=True, **fields)  # type: ignore[arg-type]


def test_rendezvous_on_one_host_is_loopback() -> None:
    run = _run(num_instances=4, num_local_instances=4, host="node7")
    assert torch_distributed.rendezvous_host(run, "ignored") == "127.0.0.1"


def test_rendezvous_across_hosts_is_instance_zeros_host() -> None:
    run = _run(num_instances=4, num_local_instances=2, host="node7")
    assert torch_distributed.rendezvous_host(run, "this-machine") == "node7"


def test_rendezvous_under_plain_mpirun_uses_the_host_name() -> None:
    run = RunView(num_instances=4, num_local_instances=2, host="")
    assert torch_distributed.rendezvous_host(run, "this-machine") == "this-machine"
    run = _run(num_instances=4, num_local_instances=2, host="localhost")
    assert torch_distributed.rendezvous_host(run, "this-machine") == "this-machine"


def test_process_group_uses_nccl_only_when_every_instance_has_a_gpu() -> None:
    assert torch_distributed.process_group_backend(False) == "gloo"
    assert torch_distributed.process_group_backend(True) == "cpu:gloo,cuda:nccl"


@pytest.mark.parametrize(
    ("from_poprun", "local_index", "count", "expected"),
    [
        (True, 3, 8, 0),  # poprun gave this instance its own devices: the first is its
        (False, 3, 8, 3),  # plain mpirun: every rank sees all; local rank picks
        (False, 5, 4, 1),  # more local ranks than GPUs: they share round-robin
    ],
)
def test_device_index(from_poprun: bool, local_index: int, count: int, expected: int) -> None:
    run = RunView(local_instance_index=local_index, num_local_instances=8, from_poprun=from_poprun)
    assert torch_distributed.device_index(run, count) == expected


def test_device_index_needs_a_device() -> None:
    with pytest.raises(PopdistError, match="device_count=0"):
        torch_distributed.device_index(RunView(), 0)


def test_the_timeout_variable() -> None:
    assert env.read_torch_timeout({}) == env.DEFAULT_TORCH_TIMEOUT_S
    assert env.read_torch_timeout({"POPDIST_TORCH_TIMEOUT": "90"}) == 90.0
    for bad in ("soon", "0", "-3", "nan"):
        with pytest.raises(PopdistError, match=f"POPDIST_TORCH_TIMEOUT='{bad}'"):
            env.read_torch_timeout({"POPDIST_TORCH_TIMEOUT": bad})


def test_the_cpu_allreduce_variable() -> None:
    assert env.read_torch_cpu_allreduce({}) == "mpi"
    assert env.read_torch_cpu_allreduce({"POPDIST_TORCH_CPU_ALLREDUCE": " Gloo "}) == "gloo"
    with pytest.raises(PopdistError, match=r"POPDIST_TORCH_CPU_ALLREDUCE='nccl'.*mpi, gloo"):
        env.read_torch_cpu_allreduce({"POPDIST_TORCH_CPU_ALLREDUCE": "nccl"})


def _view(spec: Any) -> Any:
    """The numpy view of the lane's ``[memory, type]`` buffer spec (as MPI would see it)."""
    import numpy as np

    memory, dtype = spec
    return np.frombuffer(memory, dtype=dtype)


class _FakeComm:
    """A communicator of one rank that doubles what it reduces, recording the order."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.reduced: list[int] = []
        self.freed = False
        self.fail_on = fail_on

    def Dup(self) -> _FakeComm:
        return self

    def Allreduce(self, where: object, spec: object, op: object) -> None:
        assert where == "IN_PLACE" and op == "SUM"
        buffer = _view(spec)
        if self.fail_on is not None and len(self.reduced) == self.fail_on:
            raise RuntimeError("MPI_ERR_TRUNCATE")
        self.reduced.append(int(buffer.size))
        buffer *= 2

    def Free(self) -> None:
        self.freed = True


class _FakeBuffer:
    @staticmethod
    def fromaddress(address: int, nbytes: int) -> Any:
        import ctypes

        return (ctypes.c_byte * nbytes).from_address(address)


class _FakeMPI:
    IN_PLACE, SUM = "IN_PLACE", "SUM"
    FLOAT, DOUBLE, INT32_T, INT64_T = "float32", "float64", "int32", "int64"
    buffer = _FakeBuffer

    @staticmethod
    def Is_finalized() -> bool:
        return False


def test_the_mpi_lane_reduces_in_place_in_submission_order_and_stops() -> None:
    import torch

    from popdist.collectives.mpilane import MpiLane

    comm = _FakeComm()
    lane = MpiLane(comm, _FakeMPI)
    tensors = [torch.ones(n) for n in (3, 1, 7)]
    works = [lane.submit(t) for t in tensors]
    for work in reversed(works):
        work.wait()
    assert comm.reduced == [3, 1, 7]
    assert all(bool((t == 2).all()) for t in tensors)
    lane.close()
    assert comm.freed
    assert MpiLane.takes(torch.ones(2))
    assert not MpiLane.takes(torch.ones(2, dtype=torch.bfloat16))


def test_a_waiter_runs_the_newest_unstarted_work_itself_and_the_lane_skips_it() -> None:
    import threading

    import torch

    from popdist.collectives.mpilane import MpiLane

    threads: list[int] = []

    class Comm(_FakeComm):
        def Allreduce(self, where: object, spec: object, op: object) -> None:
            threads.append(threading.get_ident())
            super().Allreduce(where, spec, op)

    comm = Comm()
    lane = MpiLane(comm, _FakeMPI)
    gate = threading.Event()
    run = lane._run
    lane._run = lambda: (gate.wait(), run())[1]  # type: ignore[method-assign]
    first = torch.ones(4)
    release = threading.Timer(5.0, gate.set)  # without run_here the thread runs it, late
    release.start()
    lane.submit(first).wait()  # the thread is held at the gate: the waiter runs it
    release.cancel()
    assert threads == [threading.get_ident()] and bool((first == 2).all())
    gate.set()
    queued = [torch.ones(2), torch.ones(3)]
    works = [lane.submit(t) for t in queued]
    works[1].wait()
    works[0].wait()
    assert comm.reduced == [4, 2, 3]  # in submission order, and the first only once
    lane.close()


def test_works_queued_without_a_wake_up_run_in_order_when_waited_for() -> None:
    import threading

    import torch

    from popdist.collectives.mpilane import MpiLane

    ran_on: list[tuple[int, int]] = []

    class Comm(_FakeComm):
        def Allreduce(self, where: object, spec: Any, op: object) -> None:
            ran_on.append((int(_view(spec).size), threading.get_ident()))
            super().Allreduce(where, spec, op)

    lane = MpiLane(Comm(), _FakeMPI)
    me = threading.get_ident()
    lane.submit(torch.ones(1), wake=False).wait()  # the newest, nothing before it: run here
    assert ran_on == [(1, me)]
    earlier, newest = lane.submit(torch.ones(2), wake=False), lane.submit(torch.ones(3), wake=False)
    earlier.wait()  # not the newest: the waiter wakes the thread, which runs both, in order
    newest.wait()
    assert [n for n, _ in ran_on] == [1, 2, 3]
    assert all(thread != me for _, thread in ran_on[1:])
    lane.close()


def test_a_failed_mpi_allreduce_is_a_collective_error_for_its_waiter() -> None:
    import torch

    from popdist.collectives import CollectiveError
    from popdist.collectives.mpilane import MpiLane

    lane = MpiLane(_FakeComm(fail_on=1), _FakeMPI)
    first, second = lane.submit(torch.ones(2)), lane.submit(torch.ones(5))
    first.wait()
    with pytest.raises(CollectiveError, match=r"\(5,\) torch.float32 .*MPI_ERR_TRUNCATE"):
        second.wait()
    lane.close()


def test_no_lane_without_an_mpi_job_already_started(monkeypatch: pytest.MonkeyPatch) -> None:
    from popdist.collectives.mpilane import MpiLane

    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    assert MpiLane.for_world() is None  # and MPI was not started to find out
    assert "mpi4py.MPI" not in sys.modules
