"""The test cluster itself: two nodes that take jobs, and nothing left when a job ends."""

from __future__ import annotations

import pytest

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
