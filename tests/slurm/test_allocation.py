"""poprun inside allocations of the two-node test cluster, given no host list.

Every job asks for 2 nodes × 2 tasks (``-N2 --ntasks-per-node=2``). ``n1`` and ``n2`` are both
this machine (each slurmd with its node's name as hostname), so an instance tells its node
by ``SLURMD_NODENAME``, which only Slurm sets on that node (poprun never forwards Slurm's
variables): it proves the instance was started *through Slurm on that node*. After every
test no job may be left running and no step daemon alive (the ``slurm`` fixture), and no
process of the test's (the suite's own guard).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
import torch

from tests.support.jobs import job_env, poprun_argv, run_job
from tests.support.slurm_cluster import ROOT, SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BIN = ROOT / "tests" / "bin"
PY = sys.executable
ALLOC = ["-N2", "--ntasks-per-node=2"]
#: (node, instance, local index, replica offset) of `--num-replicas 8` on 2 × 2 tasks.
PLACED = [("n1", 0, 0, 0), ("n1", 1, 1, 2), ("n2", 2, 0, 4), ("n2", 3, 1, 6)]


def views(directory: Path) -> list[dict[str, object]]:
    files = sorted(directory.glob("*.json"), key=lambda p: int(p.stem))
    return [json.loads(p.read_text()) for p in files]


def where(directory: Path, replicas: int = 8) -> list[str]:
    """``poprun --num-replicas 8 --print-topology`` of where.py (no host list, no count)."""
    return poprun_argv(
        "--num-replicas", str(replicas), "--print-topology",
        PY, str(BIN / "where.py"), str(directory),
        "SLURMD_NODENAME", "POPDIST_HOST", "POPDIST_NUM_LOCAL_INSTANCES",
    )  # fmt: skip


def assert_placed(directory: Path, output: str) -> None:
    """Four instances, two per node, each with its PopDist values, started on its node."""
    seen = views(directory)
    got = [
        (v["env"]["SLURMD_NODENAME"], v["instance"], v["local_instance"], v["offset"]) for v in seen
    ]  # type: ignore[index]
    assert got == PLACED, output
    for v in seen:
        assert (v["instances"], v["replicas"], v["local_replicas"]) == (4, 8, 2)
        env = v["env"]
        assert env["POPDIST_HOST"] == env["SLURMD_NODENAME"] == v["host"]  # type: ignore[index]
        assert env["POPDIST_NUM_LOCAL_INSTANCES"] == "2"  # type: ignore[index]
    assert "Slurm allocation: job " in output and "tasks per node 2(x2)" in output, output


def test_salloc_without_a_host_list_runs_two_instances_per_node(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    done = slurm.salloc(ALLOC, where(tmp_path), env=job_env())
    assert done.returncode == 0, done.stdout
    assert_placed(tmp_path, done.stdout)
    assert "left behind" not in done.stdout  # mpirun's srun launchers end by themselves


def test_an_sbatch_script_without_a_host_list(slurm: SlurmCluster, tmp_path: Path) -> None:
    script = f"#!/bin/sh\ncd {shlex.quote(str(ROOT))}\nexec {shlex.join(where(tmp_path))}\n"
    _, output, done = slurm.sbatch(script, ALLOC, env=job_env())
    assert done.returncode == 0, output
    assert_placed(tmp_path, output)


def test_poprun_started_by_srun_plans_for_the_whole_job(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """``srun -N1 -n1 poprun`` runs in a step of one task on n1; the plan is still the job's
    four tasks, and the daemons' srun shares the step's CPUs (``--overlap``)."""
    done = slurm.salloc(ALLOC, ["srun", "-N1", "-n1", *where(tmp_path)], env=job_env())
    assert done.returncode == 0, done.stdout
    assert_placed(tmp_path, done.stdout)
    assert "poprun runs in an srun step" in done.stdout


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--num-instances", "6", "--num-replicas", "6"],
            "poprun: error: --num-instances=6: is more than the 4 tasks of Slurm job ",
        ),
        (
            ["-H", "n1,n3", "--num-instances", "2", "--num-replicas", "2"],
            "poprun: error: --host=n3: is not a node of Slurm job ",
        ),
    ],
    ids=["more-instances-than-tasks", "host-not-in-the-job"],
)
def test_an_impossible_request_is_one_line_and_nothing_runs(
    slurm: SlurmCluster, tmp_path: Path, options: list[str], message: str
) -> None:
    argv = poprun_argv(*options, PY, str(BIN / "where.py"), str(tmp_path))
    done = slurm.salloc(ALLOC, argv, env=job_env())
    assert done.returncode == 2, done.stdout
    errors = [line for line in done.stdout.splitlines() if line.startswith("poprun:")]
    assert len(errors) == 1 and errors[0].startswith(message), done.stdout
    assert "(nodes n[1-2], 2(x2) tasks per node, 4 in all)" in errors[0]
    assert list(tmp_path.iterdir()) == []  # no instance ran


def test_a_failure_on_the_second_node_is_reported_with_its_code_and_stderr(
    slurm: SlurmCluster,
) -> None:
    argv = poprun_argv("--num-replicas", "4", str(BIN / "fail_one.sh"), "3", "7")
    done = slurm.salloc(ALLOC, argv, env=job_env())
    assert done.returncode == 7, done.stdout
    report = done.stdout[done.stdout.index("poprun: instance 3 failed first") :]
    assert report.startswith("poprun: instance 3 failed first: exit code 7 (host n2, pid "), report
    assert "instance 3 is failing on purpose" in report  # its stderr tail
    ours = [line for line in report.splitlines() if not line.startswith("salloc:")]
    assert ours[-1].endswith("exit code 7"), report


def test_training_ends_at_the_same_weights_as_on_one_host(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """``poprun --num-replicas 8`` in the job (4 instances over 2 nodes) and the same run on
    one host (``--num-instances 4``, no Slurm) train to the same weights."""
    from tests.support.topology import MODELS, OPTIMIZERS

    one, job = tmp_path / "one-host", tmp_path / "slurm"
    one.mkdir()
    job.mkdir()
    program = [PY, str(BIN / "executor_topology.py")]
    alone = run_job(
        poprun_argv("--num-instances", "4", "--num-replicas", "8", *program, str(one), "2"),
        env=job_env(),
    )
    assert alone.returncode == 0, alone.stdout
    done = slurm.salloc(
        ALLOC,
        poprun_argv("--num-replicas", "8", *program, str(job), "2"),
        env=job_env(),
        timeout=240,
    )
    assert done.returncode == 0, done.stdout
    for model in MODELS:
        for opt in OPTIMIZERS:
            want = torch.load(one / f"{model}.{opt}.0.pt", weights_only=True)
            for rank in range(4):
                got = torch.load(job / f"{model}.{opt}.{rank}.pt", weights_only=True)
                for key, value in want.items():
                    torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7)


def test_uneven_tasks_per_node_place_uneven_instances(slurm: SlurmCluster, tmp_path: Path) -> None:
    """``-N2 -n3``: Slurm lays out 2 tasks on n1 and 1 on n2 (``2,1``); so does poprun."""
    done = slurm.salloc(["-N2", "-n3"], where(tmp_path, replicas=6), env=job_env())
    assert done.returncode == 0, done.stdout
    seen = views(tmp_path)
    got = [
        (v["env"]["SLURMD_NODENAME"], v["instance"], v["local_instance"], v["offset"]) for v in seen
    ]  # type: ignore[index]
    assert got == [("n1", 0, 0, 0), ("n1", 1, 1, 2), ("n2", 2, 0, 4)], done.stdout
    assert [v["env"]["POPDIST_NUM_LOCAL_INSTANCES"] for v in seen] == ["2", "2", "1"]  # type: ignore[index]
    assert "tasks per node 2,1 (SLURM_TASKS_PER_NODE): n1:2, n2:1" in done.stdout


def test_the_time_out_ends_the_job_on_both_nodes(slurm: SlurmCluster) -> None:
    """Nothing fails; ``--timeout`` ends every instance on both nodes (the fixtures then
    check that no job, step daemon or process is left)."""
    argv = poprun_argv("--timeout", "3", "--num-replicas", "4", str(BIN / "fail_one.sh"), "9", "1")
    done = slurm.salloc(ALLOC, argv, env=job_env())
    assert done.returncode == 124, done.stdout
