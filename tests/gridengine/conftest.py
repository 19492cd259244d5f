"""The Grid Engine tier: real poprun inside jobs of a real Grid Engine cell on namespace hosts.

One cell (``sge_qmaster`` in h1, an ``sge_execd`` in h1 and h2, a parallel environment
``mpi``) for the whole session, a few seconds to start (:mod:`tests.support.gridengine_cluster`).
Where it cannot run (no gridengine packages, not root, no namespaces) the tier is skipped
with the reason; under ``CI=true`` as root it fails instead, so CI never skips it silently
(set-up installs Grid Engine there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.gridengine_cluster import GridEngineCluster, unavailable
from tests.support.tiers import require


def _must_run() -> bool:
    return os.environ.get("CI") == "true" and os.geteuid() == 0


@pytest.fixture(scope="session")
def cell() -> Iterator[GridEngineCluster]:
    """The session's cell; jobs go through ``cell.qsub``/``cell.submit``."""
    require("Grid Engine", unavailable(), _must_run())
    made = GridEngineCluster(hosts=2)
    made.start()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def sge(cell: GridEngineCluster) -> Iterator[GridEngineCluster]:
    """The cell; after the test no job may still be listed and no process of a job be left
    on any host."""
    yield cell
    left = cell.wait_clean(within=15.0)
    if left:
        for job in {entry.split()[0] for entry in left if entry.split()[0].isdigit()}:
            cell.client("qdel", "-f", job)
        assert cell.hosts is not None
        cell.hosts.close_jobs()
        pytest.fail(f"left on the Grid Engine cell after the test: {left}")
