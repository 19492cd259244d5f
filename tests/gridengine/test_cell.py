"""The test cell itself: a parallel job gets its slots on both hosts, Open MPI starts its
daemons there through ``qrsh -inherit``, and the daemons end with the harness."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.gridengine_cluster import GridEngineCluster
from tests.support.hosts import remove_stale
from tests.support.processes import kill_harness, reap_children

pytestmark = [pytest.mark.gridengine]


def test_a_parallel_job_gets_two_slots_on_each_host(sge: GridEngineCluster) -> None:
    script = '#!/bin/sh\necho "slots=$NSLOTS hosts=$NHOSTS"\ncat "$PE_HOSTFILE"\nexit 3\n'
    _, output, end = sge.qsub(script, ["-pe", "mpi", "4"])
    assert (end.exit_status, end.failed) == (3, "0"), output
    assert "slots=4 hosts=2" in output
    lines = [line.split() for line in output.splitlines() if "all.q@" in line]
    assert sorted((f[0], f[1]) for f in lines) == [("h1", "2"), ("h2", "2")], output


def test_open_mpi_starts_its_daemons_through_qrsh_inherit(sge: GridEngineCluster) -> None:
    """Bare mpirun, no host list: Open MPI reads ``PE_HOSTFILE`` and reaches the other host
    with ``qrsh -inherit`` (its plm_rsh verbose line names the agent)."""
    script = (
        "#!/bin/sh\nmpirun --allow-run-as-root --bind-to none --mca plm_base_verbose 5 "
        "hostname 2>&1\n"
    )
    _, output, end = sge.qsub(script, ["-pe", "mpi", "4"])
    assert end.exit_status == 0, output
    assert "qrsh -inherit" in output, output
    names = [line for line in output.splitlines() if line in ("h1", "h2")]
    assert sorted(names) == ["h1", "h1", "h2", "h2"], output


def test_the_daemons_end_when_the_process_that_started_them_is_killed(
    cell: GridEngineCluster,
) -> None:
    """A test run killed outright (no ``stop()``) must not leave the cell's daemons behind.

    (``cell``: the tier's fixture, here so that the test is skipped where the tier cannot run.)
    """
    try:
        said, alive = kill_harness("tests.support.gridengine_cluster", within=30)
    finally:
        remove_stale()  # the killed harness's hosts: their namespaces and holders
        reap_children()
    _remove_cell_dir(said)
    assert not alive, f"daemons outlived the killed harness: {alive}"


def _remove_cell_dir(said: list[str]) -> None:
    """The killed harness's private directory (``/tmp/sge-*``), named in its ``with:`` line."""
    for line in said:
        for word in line.split():
            if word.startswith("SGE_ROOT="):
                root = Path(word.split("=", 1)[1])
                if root.is_absolute() and root.name.startswith("sge-"):
                    shutil.rmtree(root, ignore_errors=True)
