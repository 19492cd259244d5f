"""Real poprun inside Grid Engine jobs: the allocation is the host source, Open MPI's daemons
start through ``qrsh -inherit`` (no ssh), training ends at the weights of the same job run
over ssh, ``qdel`` leaves nothing, and a host outside the allocation is refused.

Each job is a ``qsub -pe mpi N`` of a script that ``exec``s poprun with no host list, from
the repository's root, with this test's environment exported (``-V``).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.support.gridengine_cluster import ROOT, GridEngineCluster, JobEnd
from tests.support.jobs import job_env, poprun_argv, run_job

pytestmark = [pytest.mark.gridengine, pytest.mark.slow]

BIN = ROOT / "tests" / "bin"
PY = sys.executable
VIEW = str(BIN / "engine_view.py")


def poprun_script(*args: str) -> str:
    """A job script that runs ``poprun ARGS`` as the job (``exec``: poprun is what Grid
    Engine signals)."""
    return f"#!/bin/sh\nexec {shlex.join(poprun_argv(*args))}\n"


def poprun_job(
    sge: GridEngineCluster, slots: int, *args: str, timeout: float = 180
) -> tuple[str, JobEnd]:
    """``qsub -pe mpi SLOTS`` of ``poprun ARGS``, to its end; (its output, its end)."""
    _, output, end = sge.qsub(
        poprun_script(*args), ["-pe", "mpi", str(slots)], env=job_env(), timeout=timeout
    )
    return output, end


def views(directory: Path) -> list[dict[str, object]]:
    files = sorted(directory.glob("*.json"), key=lambda p: int(p.stem))
    return [json.loads(p.read_text()) for p in files]


@pytest.fixture
def no_sshd(sge: GridEngineCluster) -> Iterator[GridEngineCluster]:
    """The cell with every host's sshd stopped for the test (started again after it): a
    job that still reaches the other host did not go by ssh."""
    assert sge.hosts is not None
    for host in sge.names:
        sge.hosts.stop_sshd(host)
    try:
        yield sge
    finally:
        for host in sge.names:
            sge.hosts.start_sshd(host)


def test_no_host_list_two_instances_on_each_host_through_qrsh(
    no_sshd: GridEngineCluster, tmp_path: Path
) -> None:
    names = ["OMPI_MCA_plm_rsh_agent", "PE_HOSTFILE"]
    output, end = poprun_job(
        no_sshd, 4, "--num-instances", "4", "--num-replicas", "8",
        PY, str(BIN / "engine_view.py"), str(tmp_path), *names,
    )  # fmt: skip
    assert end.exit_status == 0, output
    seen = views(tmp_path)
    assert len(seen) == 4, output
    by_host: dict[str, list[int]] = {}
    for v in seen:
        by_host.setdefault(str(v["host"]), []).append(int(v["local_instance"]))  # type: ignore[call-overload]
        assert (v["instances"], v["replicas"], v["local_replicas"], v["local_instances"]) == (
            4, 8, 2, 2,
        ), v  # fmt: skip
        assert v["env"]["OMPI_MCA_plm_rsh_agent"] is None, v  # type: ignore[index]
        ancestry = v["ancestors"]
        assert "sge_shepherd" in ancestry and "sshd" not in ancestry, v  # type: ignore[operator]
    assert {h: sorted(i) for h, i in by_host.items()} == {"h1": [0, 1], "h2": [0, 1]}, seen
    # each host's instances are its own shepherd's: the job script's on the host poprun runs
    # on, the qrsh -inherit task's (qrsh_starter, then Open MPI's orted) on the other
    tasks = [str(v["host"]) for v in seen if "qrsh_starter" in v["ancestors"]]  # type: ignore[operator]
    assert len(tasks) == 2 and len(set(tasks)) == 1, seen


def test_print_topology_names_grid_engine_and_its_host_file(sge: GridEngineCluster) -> None:
    output, end = poprun_job(
        sge, 4, "--print-topology", "--num-instances", "4", "--num-replicas", "4", "true"
    )
    assert end.exit_status == 0, output
    assert "Grid Engine" in output and "PE_HOSTFILE" in output, output
    rows = [line.split("|") for line in output.splitlines() if line.startswith(("| h1", "| h2"))]
    assert sorted(row[1].strip() for row in rows) == ["h1", "h1", "h2", "h2"], output


def test_training_ends_at_the_weights_of_the_same_job_over_ssh(
    sge: GridEngineCluster, tmp_path: Path
) -> None:
    """One instance on each host, two replicas each: inside a ``qsub -pe mpi 2`` job (no
    host list), then with ``-H h1,h2`` over ssh on the same hosts, outside Grid Engine."""
    assert sge.hosts is not None
    program = [PY, str(BIN / "executor_topology.py")]
    under_sge, over_ssh = tmp_path / "sge", tmp_path / "ssh"
    under_sge.mkdir()
    over_ssh.mkdir()
    output, end = poprun_job(
        sge, 2, "--num-instances", "2", "--num-replicas", "4", *program, str(under_sge), "2"
    )
    assert end.exit_status == 0, output
    argv = poprun_argv(
        "--num-instances", "2", "--num-replicas", "4", "-H", "h1,h2",
        *program, str(over_ssh), "2",
    )  # fmt: skip
    done = run_job(sge.hosts.on("h1", argv, cwd=str(ROOT)), env=sge.hosts.env(job_env()))
    assert done.returncode == 0, done.stdout
    saved = sorted(p.name for p in under_sge.iterdir())
    assert saved == sorted(p.name for p in over_ssh.iterdir()) and len(saved) == 8, saved
    for name in saved:
        a, b = torch.load(under_sge / name), torch.load(over_ssh / name)
        for key, value in a.items():
            torch.testing.assert_close(value, b[key], rtol=1e-6, atol=1e-7)


def test_qdel_leaves_nothing_on_any_host(sge: GridEngineCluster) -> None:
    script = poprun_script(
        "--num-instances", "4", "--num-replicas", "4",
        "/bin/sh", "-c", 'echo "up on $(hostname)"; exec sleep 600',
    )  # fmt: skip
    job_id, _ = sge.submit(script, ["-pe", "mpi", "4"], env=job_env())
    deadline = time.monotonic() + 90
    while True:
        left = sge.leftovers()
        sleeping = {h: sum(p.endswith(": sleep 600") for p in ps) for h, ps in left.items()}
        if sleeping == {"h1": 2, "h2": 2} or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sleeping == {"h1": 2, "h2": 2}, left
    done = sge.client("qdel", str(job_id))
    assert done.returncode == 0, done.stdout
    end = sge.wait_job(job_id, timeout=60)
    assert end.failed != "0" or end.exit_status != 0, end  # it was ended, not run to its end
    assert sge.wait_clean(within=15.0) == []


def test_a_host_outside_the_allocation_is_one_line_and_exit_2(
    sge: GridEngineCluster, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    output, end = poprun_job(
        sge, 2, "--num-instances", "2", "--num-replicas", "2", "-H", "h1,h3",
        "/bin/sh", "-c", f"touch {ran}",
    )  # fmt: skip
    assert end.exit_status == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poprun: error:"), output
    assert "h3" in lines[0], lines
    assert not ran.exists()


#: What Grid Engine sets on the job's master host that describes that host alone (another
#: host's instance must not see the master's value), and what describes the job (it must).
NODE_ONLY = ["HOSTNAME", "PE_HOSTFILE", "TMPDIR", "TMP"]
JOB_WIDE = ["JOB_ID", "NSLOTS", "PE", "MY_SETTING"]


def test_what_grid_engine_sets_and_what_reaches_the_other_hosts_instances(
    sge: GridEngineCluster, tmp_path: Path
) -> None:
    out = tmp_path / "views"
    out.mkdir()
    names = [*NODE_ONLY, *JOB_WIDE]
    poprun = poprun_argv("--num-instances", "4", "--num-replicas", "4", PY, VIEW, str(out), *names)
    master = tmp_path / "master"
    script = f"#!/bin/sh\nhostname > {master}.host\nenv > {master}.env\nexec {shlex.join(poprun)}\n"
    _, output, end = sge.qsub(script, ["-pe", "mpi", "4"], env=job_env(MY_SETTING="job-wide"))
    assert end.exit_status == 0, output
    host = (tmp_path / "master.host").read_text().strip()
    env = dict(
        line.split("=", 1)
        for line in (tmp_path / "master.env").read_text().splitlines()
        if "=" in line
    )
    assert {"HOSTNAME", "PE_HOSTFILE", "TMP"} <= set(env), sorted(env)  # what the test reads
    others = [v for v in views(out) if v["host"] != host]
    assert len(others) == 2, output
    for v in others:
        got = v["env"]
        assert isinstance(got, dict)
        leaked = {n: got[n] for n in NODE_ONLY if n in env and got[n] == env[n]}
        assert leaked == {}, f"the master host's own values reached {v['host']}: {leaked}"
        assert {n: got[n] for n in JOB_WIDE} == {n: env[n] for n in JOB_WIDE}, v
