"""The test cluster itself: two nodes that take jobs, and nothing left when a job ends."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.processes import kill_harness, reap_children
from tests.support.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.slurm]


def test_srun_places_tasks_on_both_nodes(slurm: SlurmCluster) -> None:
    done = slurm.srun(["-N2", "--ntasks-per-node=2"], ["sh", "-c", 'echo "$SLURMD_NODENAME"'])
    assert done.returncode == 0, done.stdout
    assert sorted(done.stdout.split()) == ["n1", "n1", "n2", "n2"]


def test_sbatch_runs_a_script_with_the_allocation(slurm: SlurmCluster) -> None:
    script = '#!/bin/sh\necho "nodes=$SLURM_JOB_NODELIST tasks=$SLURM_TASKS_PER_NODE"\nexit 3\n'
    job, output, done = slurm.sbatch(script, ["-N2", "--ntasks-per-node=2"])
    assert job > 0 and (done.stdout, done.returncode) == ("FAILED", 3), output
    assert "nodes=n[1-2] tasks=2(x2)" in output


def test_the_daemons_end_when_the_process_that_started_them_is_killed(
    cluster: SlurmCluster,
) -> None:
    """A test run killed outright (no ``stop()``) must not leave slurmctld and slurmd behind.

    (``cluster``: the tier's fixture, here so that the test is skipped where Slurm cannot run.)
    """
    try:
        said, alive = kill_harness("tests.support.slurm_cluster", within=15)
    finally:
        reap_children()
    _remove_cluster_dir(said)
    assert not alive, f"daemons outlived the killed harness: {alive}"


def _remove_cluster_dir(said: list[str]) -> None:
    """The killed harness's private directory (``/tmp/slurm-*``), named in its ``use:`` line."""
    for line in said:
        if line.startswith("use:") and "SLURM_CONF=" in line:
            conf = Path(line.split("SLURM_CONF=", 1)[1].strip())
            if (
                conf.is_absolute()
                and conf.name == "slurm.conf"
                and conf.parent.name.startswith("slurm-")
            ):
                shutil.rmtree(conf.parent, ignore_errors=True)
