"""Supervision at scale (issue 53): what poprun keeps per instance stays bounded, what an
event costs does not grow with the job, and the file descriptors a job needs (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from poprun.config import run_config as cfg
from poprun.plan.topology import plan
from poprun.run.launch import BASE_FDS, descriptors_needed
from poprun.run.processes import JobProcesses
from poprun.run.progress.board import KEPT_CALLS, ProgressBoard
from tests.support.fakes import Clock

pytestmark = pytest.mark.unit

ENV = {"PATH": "/usr/bin:/bin"}


def _call(seq: int, shape: tuple[int, ...] = (4,)) -> list[Any]:
    return [seq, "allreduce", "g", 16, list(shape), "float32", ["train.py", 7, "main"], 0.0]


def _record(instance: int, seq: int, shape: tuple[int, ...] = (4,), **extra: Any) -> dict[str, Any]:
    recent = [_call(s) for s in range(max(1, seq - 7), seq)] + [_call(seq, shape)]
    return {"instance": instance, "host": f"h{instance // 8}", "seq": seq, "done": seq,
            "steps": seq, "recent": recent, **extra}  # fmt: skip


def test_a_desync_among_thousands_names_the_lowest_other_instance() -> None:
    board = ProgressBoard(Clock())
    for instance in range(4096):
        board.update(_record(instance, 5))
    assert board.desync() is None
    board.update(_record(3000, 6, shape=(8,)))
    board.update(_record(17, 6))
    board.update(_record(9, 6))  # seq 6: 3000 issued (8,), 9 and 17 (4,)
    desync = board.desync()
    assert desync is not None and desync.seq == 6
    assert (desync.first[0], desync.second[0]) == (17, 3000)  # the first that differed


def test_the_board_keeps_a_bounded_window_of_sequence_numbers() -> None:
    board = ProgressBoard(Clock())
    for seq in range(1, 5000):
        board.update(_record(seq % 4, seq))
    assert len(board._by_seq) <= KEPT_CALLS
    board.update(_record(0, 10**9))  # a jump sweeps once
    assert len(board._by_seq) <= KEPT_CALLS


def test_finishing_and_the_reports_are_kept_as_they_come() -> None:
    clock = Clock()
    board = ProgressBoard(clock)
    board.update(_record(0, 1, exiting=True))
    assert board.finishing()
    board.update(_record(1, 1))
    assert not board.finishing()
    clock.t += 2
    board.update(_record(1, 2, exiting=True))
    board.update(_record(0, 1, exiting=True))  # a repeat does not count twice
    assert board.finishing()
    assert board.take_reports() == {0: clock.t, 1: clock.t}
    assert board.take_reports() == {}  # taken: the next tick sees only what came since


def test_this_hosts_instances_are_known_once() -> None:
    config = cfg.build({"num_instances": "6", "num_replicas": "6", "host": ["a,localhost,b"]},
                       ("/bin/true",), ENV)  # fmt: skip
    procs = JobProcesses(plan(config), {0: 10, 2: 12, 3: 13, 4: 14})
    assert procs.local == {2, 3}
    procs.ended(3)
    assert procs.local_pids() == [12]
    assert procs.running() in ([0, 1, 2, 4, 5], [0, 1, 4, 5])  # 2: whether pid 12 lives


@pytest.mark.parametrize(
    ("cli", "needed"),
    [
        ({"num_instances": "128", "num_replicas": "128"}, BASE_FDS + 3 * 128),
        ({"num_instances": "128", "num_replicas": "128", "output_dir": "/tmp/o"},
         BASE_FDS + 5 * 128),
        ({"num_instances": "4096", "num_replicas": "4096", "host": ["n[0-511]"]},
         BASE_FDS + 2 * 512),  # mpirun's: a connection and an ssh a host
        ({"num_instances": "16", "num_replicas": "16", "host": ["localhost,n[1-3]"]},
         BASE_FDS + 3 * 4),
    ],
)  # fmt: skip
def test_the_descriptors_a_job_needs(cli: dict[str, Any], needed: int) -> None:
    config = cfg.build(cli, ("/bin/true",), ENV)
    assert descriptors_needed(config, plan(config)) == needed
