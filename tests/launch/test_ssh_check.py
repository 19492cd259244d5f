"""poprun's ssh check before a multi-host launch, with a stand-in ssh (no network needed).

The stand-in records every call and refuses the hosts named in ``REFUSE``; the real thing is
exercised across namespace hosts in ``tests/multihost``.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from poprun.run import ssh_check as reach
from tests.support.jobs import job_env, poprun_argv, run_job

pytestmark = pytest.mark.launch

FAKE_SSH = """#!/bin/sh
# A stand-in ssh: log the call; refuse the hosts listed in $REFUSE.
echo "$@" >> "$SSH_LOG"
# the host: the last argument, or the one before a remote command ("HOST true")
for arg in "$@"; do host=$prev; prev=$arg; done
[ "$prev" = true ] || host=$prev
for bad in $REFUSE; do
    if [ "$host" = "$bad" ]; then
        echo "ssh: connect to host $host port 22: Connection refused" >&2
        exit 255
    fi
done
exit 0
"""


@pytest.fixture
def fake_ssh(tmp_path: Path) -> Path:
    path = tmp_path / "fake-ssh"
    path.write_text(FAKE_SSH)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_unreachable_hosts_are_named_in_host_order(
    fake_ssh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls"
    monkeypatch.setenv("SSH_LOG", str(log))
    monkeypatch.setenv("REFUSE", "n3 n1")
    bad = reach.unreachable(["n1", "n2", "n3"], [str(fake_ssh)], timeout=2)
    assert [host for host, _ in bad] == ["n1", "n3"]
    assert "Connection refused" in bad[0][1]
    calls = sorted(log.read_text().splitlines())
    assert calls == [f"-o BatchMode=yes -o ConnectTimeout=2 {h} true" for h in ("n1", "n2", "n3")]


def test_a_check_that_opens_masters_only_logs_in(
    fake_ssh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With masters, ``ssh -N HOST``: no remote session for ``true`` before mpirun's own."""
    log = tmp_path / "calls"
    monkeypatch.setenv("SSH_LOG", str(log))
    monkeypatch.setenv("REFUSE", "n2")
    bad = reach.unreachable(["n1", "n2"], [str(fake_ssh)], timeout=2, masters=True)
    assert [host for host, _ in bad] == ["n2"]
    calls = sorted(log.read_text().splitlines())
    assert calls == [f"-o BatchMode=yes -o ConnectTimeout=2 -N {h}" for h in ("n1", "n2")]


def test_a_host_that_never_answers_is_unreachable(tmp_path: Path) -> None:
    hang = tmp_path / "hang-ssh"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")
    hang.chmod(0o755)
    bad = reach.unreachable(["slow"], [str(hang)], timeout=0.1)
    assert bad and bad[0][0] == "slow" and "no answer" in bad[0][1]


@pytest.mark.parametrize(
    ("args", "environ", "expected"),
    [
        ([], {}, ["ssh"]),
        ([], {"OMPI_MCA_plm_rsh_agent": "/opt/ssh-wrap -q : rsh"}, ["/opt/ssh-wrap", "-q"]),
        (
            ["--mca", "plm_rsh_agent", "ssh -p 2222"],
            {"OMPI_MCA_plm_rsh_agent": "x"},
            ["ssh", "-p", "2222"],
        ),
        ([], {"OMPI_MCA_plm_rsh_agent": "rsh"}, None),
    ],
)
def test_the_check_uses_open_mpis_launch_agent(
    args: list[str], environ: dict[str, str], expected: list[str] | None
) -> None:
    assert reach.agent(args, environ) == expected


@pytest.mark.parametrize(
    ("args", "environ", "engine_ssh", "expected"),
    [
        ([], {}, True, False),
        ([], {}, False, True),  # the engine starts them (srun, qrsh -inherit, blaunch)
        (["--mca", "plm", "rsh"], {}, False, False),  # the user's plm wins
        ([], {"OMPI_MCA_plm": "slurm"}, True, True),
    ],
)
def test_no_check_when_a_scheduler_starts_the_daemons(
    args: list[str], environ: dict[str, str], engine_ssh: bool, expected: bool
) -> None:
    assert reach.launched_by_scheduler(environ, args, engine_ssh) is expected


def test_poprun_names_the_unreachable_host_and_launches_nothing(
    fake_ssh: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "launched"
    env = job_env(
        OMPI_MCA_plm_rsh_agent=str(fake_ssh), SSH_LOG=str(tmp_path / "calls"), REFUSE="nodeB"
    )
    argv = poprun_argv(
        "--num-instances",
        "2",
        "--num-replicas",
        "2",
        "-H",
        "nodeA,nodeB",
        "--ssh-wait",
        "0",
        "/bin/sh",
        "-c",
        f"touch {marker}",
    )
    result = run_job(argv, env=env, timeout=60)
    assert result.returncode == 2, result.stdout
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poprun: error: --host=nodeB: "), lines
    assert "ssh" in lines[0] and "Connection refused" in lines[0] and "--ssh-check=no" in lines[0]
    assert not marker.exists()
    # Both hosts were tried at once (logging in only: -N, the masters stay for mpirun), and
    # only the check ran: no orted was started by ssh; the rest is the clean-up of the
    # check's master connections.
    calls = (tmp_path / "calls").read_text().splitlines()
    tried = [line.split()[-1] for line in calls if line.split()[-2] == "-N"]
    assert sorted(tried) == ["nodeA", "nodeB"], calls
    assert all("ControlMaster=auto" in line for line in calls if line.split()[-2] == "-N")
    cleanup = [line for line in calls if line.split()[-2] != "-N"]
    assert cleanup and all(line.split()[-3:-1] == ["-O", "exit"] for line in cleanup), calls
    assert "-N nodeB`" in lines[0]


def test_ssh_check_no_skips_it(fake_ssh: Path, tmp_path: Path) -> None:
    env = job_env(
        OMPI_MCA_plm_rsh_agent=str(fake_ssh), SSH_LOG=str(tmp_path / "calls"), REFUSE="nodeB"
    )
    argv = poprun_argv(
        "--ssh-check=no",
        "--dry-run",
        "-H",
        "nodeA,nodeB",
        "--num-instances",
        "2",
        "--num-replicas",
        "2",
        sys.executable,
    )
    result = run_job(argv, env=env, timeout=60)
    assert result.returncode == 0, result.stdout
    assert not (tmp_path / "calls").exists()
    assert os.path.basename(sys.executable) in result.stdout
