"""The Slurm tier: real poprun inside allocations of a real two-node Slurm cluster.

One cluster (``slurmctld`` + slurmd ``n1`` and ``n2``, both on this machine) for the whole
session, about a second to start (:mod:`tests.support.slurm_cluster`). Where it cannot run
(no ``slurm-wlm``, not root) the tier is skipped with the reason; under ``CI=true`` as root it
fails instead, so CI never skips it silently (set-up installs Slurm there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.slurm_cluster import SlurmCluster, unavailable
from tests.support.tiers import require


def _must_run() -> bool:
    return os.environ.get("CI") == "true" and os.geteuid() == 0


@pytest.fixture(scope="session")
def cluster() -> Iterator[SlurmCluster]:
    """The session's cluster; jobs go through ``cluster.salloc``/``sbatch``/``srun``."""
    require("Slurm", unavailable(), _must_run())
    made = SlurmCluster(nodes=2, cpus=4)
    made.start()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def slurm(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster; after the test no job may still run and no step daemon be left."""
    yield cluster
    left = cluster.wait_clean(within=15.0)
    if left:
        cluster.client("scancel", "--full", *[j.split()[0] for j in left if j[0].isdigit()])
        pytest.fail(f"left on the Slurm cluster after the test: {left}")
