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


# --- reports that summarise -----------------------------------------------------------------

SCREEN = 30  # lines: what "readable on one screen" means here


def test_ranges_hosts_and_spreads_read_short() -> None:
    from poprun import summary

    assert summary.ranges([0, 1, 2, 3, 5, 7, 8, 9]) == "0-3, 5, 7-9"
    assert summary.ranges(range(0, 40, 2), most=3) == "0, 2, 4, … (17 more runs)"
    assert summary.hosts(f"node{i}" for i in range(512)) == "node[0-511]"
    assert summary.hosts(["a", "gpu01", "gpu02", "gpu09", "gpu10", "n1", "n3"]) == (
        "a, gpu[01-02], gpu[09-10], n1, n3"
    )
    assert summary.hosts((f"h{i}" for i in range(0, 40, 2)), most=2) == "h0, h2, … (18 more hosts)"
    assert summary.spread([1.0, 3.0, 2.0], lambda v: f"{v:g} s") == "1 s-3 s (median 2 s)"
    assert summary.spread([], str) == "-" and summary.count(4096, "instance") == "4,096 instances"


def _config(instances: int, hosts: int, replicas: int | None = None) -> cfg.RunConfig:
    cli = {"num_instances": str(instances), "num_replicas": str(replicas or 2 * instances)}
    if hosts > 1:
        cli["host"] = f"node[0-{hosts - 1}]"
    return cfg.build(cli, ("/bin/true",), ENV)


def test_print_topology_of_4096_instances_is_a_row_per_run_of_alike_hosts() -> None:
    from poprun.plan.topology import on_hosts, render

    text = render(plan(_config(4096, 512)))
    assert "| node[0-511] | 0-4095    | 8      | 0-8191 (2 each) | 0-8191  | -    |" in text
    assert len(text.splitlines()) == 6
    lost = on_hosts(_config(4096, 512), tuple(f"node{i}" for i in range(511)))
    rows = render(plan(lost)).splitlines()[4:-1]  # 8192 replicas on 4088: 16 hold 3
    assert [r.split("|")[1].strip() for r in rows] == ["node[0-1]", "node[2-510]"]
    assert "(3 each)" in rows[0] and "(2 each)" in rows[1]
    small = render(plan(_config(16, 1)))  # up to the threshold: a row per instance
    assert len(small.splitlines()) == 16 + 5


def _figures(n: int, *, pending: bool = True) -> list[Any]:
    from poprun.run.progress.board import CollectiveCall, InstanceFigures

    out = []
    for i in range(n):
        call = CollectiveCall(7, "allreduce", "g", 16, (4,), "float32", "train.py:7 in main", 60.0)
        waits = pending and i not in (5, n - 1)
        out.append(InstanceFigures(
            i, f"node{i // 8}", 100, 6400, 0.01 + (i % 5) * 0.001, 0.1 if i == 33 else 2.0, 300,
            1, 30 << 20, (30 + i % 4) << 20, 99.0, call if waits else None, pid=1000 + i,
            issued=7 if waits else 6, reported_at=99.0,
        ))  # fmt: skip
    return out


def test_the_straggler_table_and_the_summary_fit_a_screen() -> None:
    from poprun.run.status.stragglers import report, summary

    figures = _figures(4096)
    table = report(figures, 0.0).splitlines()
    assert len(table) <= SCREEN and "the 8 with the most own work" in table[0]
    assert table[2].split()[1] == "33"  # the instance with the most own work comes first
    assert table[-1].split()[1:3] == ["4,088", "more"]
    live = summary(figures, 100.0, instances=4096, started=0.0).splitlines()
    assert len(live) <= SCREEN
    assert live[-1] == (
        "poprun: 4,094 instances (0-4, 6-4094) are in collective #7 allreduce 'g' for 40 s"
    )


def test_the_hang_report_of_4096_instances_names_the_missing_ones() -> None:
    from poprun.run.progress.diagnosis import hang_report

    figures = _figures(4096)
    jobs = [(i, f"node{i // 8}") for i in range(4096 + 20)]  # 20 never reported
    text = hang_report(figures, jobs, now=100.0, timeout=30).splitlines()
    assert len(text) <= SCREEN
    assert text[1].startswith("poprun: 4,094 instances (0-4, 6-4094) on node[0-511] wait in")
    assert any("instance 5 (host node0, pid 1005) is missing" in line for line in text)
    assert any("instance 4095 (host node511, pid 5095) is missing" in line for line in text)
    assert text[-1].startswith("poprun: 20 instances (4096-4115) on node[512-514] sent no")


def test_a_time_out_of_4096_instances_is_one_readable_report() -> None:
    from poprun.run.verdict import InstanceResult, RunResult, decide

    instances = tuple(InstanceResult(i, f"node{i // 8}", 100 + i) for i in range(4096))
    result = RunResult(instances, returncode=-15, timeout=60.0, timed_out=True,
                       still_running=tuple(range(4096)))  # fmt: skip
    code, text = decide(result)
    assert code == 124 and len(text.splitlines()) == 2
    assert "instances still running: 4,096 instances (0-4095) on 512 hosts (node[0-511]); " in text
    assert "the first 8: 0 (host node0, pid 100), 1 (host node0, pid 101)" in text


def test_the_status_json_of_many_instances_is_the_slowest_and_a_summary() -> None:
    from poprun.run.status.metrics import status_json

    data = status_json(_figures(4096), 100.0, instances=4096, started=0.0)
    assert [row["instance"] for row in data["progress"]][:1] == [33] and len(data["progress"]) == 8
    assert data["summary"]["rest"]["instances"].endswith("(4,088)")
    assert data["summary"]["rest"]["hosts"] == "node[0-511]"
    every = status_json(_figures(4096), 100.0, instances=4096, started=0.0, every=True)
    assert len(every["progress"]) == 4096 and "summary" not in every
    assert "summary" not in status_json(_figures(16), 100.0, instances=16, started=0.0)
