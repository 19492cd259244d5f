"""Real poprun in the clusters that cannot run here, simulated on namespace hosts.

Kubernetes: the pods of an MPIJob, a TrainJob and a Volcano job as namespace hosts with the
operator's contract at its real paths (:mod:`tests.multihost.pods`): the launcher's host
file, environment and ssh keys, plain ``ssh`` to port 2222, a worker's sshd starting late,
a 64 MiB ``/dev/shm``, SIGTERM from a pod deletion, poprun as the container's PID 1, the v1
operator's ``kubexec.sh`` agent. PBS and LSF: their files and variables on h1-h3 (a stand-in
``blaunch`` for LSF). And, per engine, what the engine sets on the launch host and what of
it reaches a remote instance. Every job leaves nothing on any host.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.multihost.pods import HOSTFILE, Layout, Pods, mpijob, trainjob, volcano
from tests.support.hosts import Hosts, unavailable
from tests.support.jobs import ROOT, job_env, poprun_argv, run_job
from tests.support.tiers import require

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

BIN = ROOT / "tests" / "bin"
PY = sys.executable
VIEW = str(BIN / "engine_view.py")


def _must_run() -> bool:
    return os.environ.get("CI") == "true" and os.geteuid() == 0 and shutil.which("ip") is not None


@pytest.fixture(scope="module")
def pj() -> Iterator[Pods]:
    """An MPIJob ``pj``: its launcher and two workers of 2 slots, each worker's
    ``/dev/shm`` 64 MiB (Docker's default)."""
    require("multi-host", unavailable(), _must_run())
    with Pods(mpijob("pj", 2), slots=2, shm="64m") as made:
        yield made


@pytest.fixture
def clean_pj(pj: Pods) -> Iterator[Pods]:
    """The MPIJob; after the test no process of the job may be left in any pod."""
    yield pj
    left = pj.hosts.wait_clean(within=10.0)
    if left:
        pj.hosts.close_jobs()
        pytest.fail(f"processes left in the pods: {left}")


MakePods = Callable[..., Pods]


@pytest.fixture
def pods_of() -> Iterator[MakePods]:
    """``pods_of(layout, slots=...)``: pods made for this test, checked clean and removed."""
    made: list[Pods] = []
    require("multi-host", unavailable(), _must_run())

    def make(layout: Layout, slots: int = 2) -> Pods:
        made.append(Pods(layout, slots=slots))
        return made[-1]

    yield make
    try:
        for pods in made:
            assert pods.hosts.wait_clean(within=10.0) == {}
    finally:
        for pods in made:
            pods.close()


def launch(
    pods: Pods, *args: str, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    """``poprun ARGS`` in the launcher pod, with the operator's environment, to its end."""
    argv = pods.on_launcher(poprun_argv(*args))
    return run_job(argv, env=pods.launcher_env(job_env(**env)), timeout=timeout)


def start(pods: Pods, argv: list[str], **env: str) -> subprocess.Popen[str]:
    """``argv`` in the launcher pod in its own session, stdout and stderr merged."""
    return subprocess.Popen(
        pods.on_launcher(argv),
        env=pods.launcher_env(job_env(**env)),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def views(directory: Path) -> list[dict[str, object]]:
    files = sorted(directory.glob("*.json"), key=lambda p: int(p.stem))
    return [json.loads(p.read_text()) for p in files]


def placed(directory: Path) -> list[tuple[object, object]]:
    return [(v["host"], v["local_instance"]) for v in views(directory)]


def wait_for_line(proc: subprocess.Popen[str], words: str, seen: list[str]) -> str | None:
    """Read ``proc``'s output into ``seen`` until a line holds ``words``; None at its end."""
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if words in line:
            return line
    return None


def sleepers(pods: Pods, host: str) -> int:
    return sum(p.endswith(": sleep 600") for p in pods.hosts.leftovers().get(host, []))


SLEEP = ["/bin/sh", "-c", 'echo "up on $(hostname)"; exec sleep 600']


# --- a) b) c) i): the host source ------------------------------------------------------------


def test_mpijob_without_a_host_list_runs_on_the_workers_by_the_host_files_slots(
    clean_pj: Pods, tmp_path: Path
) -> None:
    done = launch(clean_pj, "--num-replicas", "8", PY, VIEW, str(tmp_path), "POPDIST_HOST")
    assert done.returncode == 0, done.stdout
    assert placed(tmp_path) == [
        ("pj-worker-0", 0), ("pj-worker-0", 1), ("pj-worker-1", 0), ("pj-worker-1", 1),
    ], done.stdout  # fmt: skip
    for v in views(tmp_path):
        assert (v["instances"], v["replicas"], v["local_replicas"], v["local_instances"]) == (
            4, 8, 2, 2,
        ), v  # fmt: skip
        # what an instance is told is where it runs (not the launcher's localhost)
        told = str(v["env"]["POPDIST_HOST"])  # type: ignore[index]
        assert told.split(".")[0] == v["host"], v


def test_mpijob_a_workers_exit_code_is_poprun_exit_code(clean_pj: Pods) -> None:
    done = launch(clean_pj, "--num-replicas", "4", PY, str(BIN / "exit_after_init.py"), "3", "7")
    assert done.returncode == 7, done.stdout
    assert "poprun: instance 3 failed first: exit code 7 (host pj-worker-1" in done.stdout


@pytest.mark.parametrize(
    "layout",
    [mpijob("pl", 2, launcher_works=True), trainjob("tl", 3, launcher_works=True)],
    ids=["mpijob-runLauncherAsWorker", "trainjob-runLauncherAsNode"],
)
def test_the_launchers_own_fqdn_in_the_host_file_is_this_host(
    pods_of: MakePods, layout: Layout, tmp_path: Path
) -> None:
    """The launcher's line is first in the host file; the launcher runs no sshd, so an ssh
    to itself would fail (within ``--ssh-wait 5``): its instance must start here."""
    pods = pods_of(layout, slots=1)
    done = launch(pods, "--ssh-wait", "5", "--num-replicas", "3", PY, VIEW, str(tmp_path))
    assert done.returncode == 0, done.stdout
    assert placed(tmp_path) == [(pod, 0) for pod in layout.nodes], done.stdout
    assert "sshd" not in views(tmp_path)[0]["ancestors"]  # type: ignore[operator]


def test_trainjob_names_its_engine_and_gives_no_role_variable(
    pods_of: MakePods, tmp_path: Path
) -> None:
    pods = pods_of(trainjob("tj", 2))
    assert "K_MPI_JOB_ROLE" not in pods.launcher_env({})
    done = launch(
        pods, "--print-topology", "--num-replicas", "4", PY, VIEW, str(tmp_path), "K_MPI_JOB_ROLE"
    )
    assert done.returncode == 0, done.stdout
    assert "TrainJob" in done.stdout and HOSTFILE in done.stdout, done.stdout
    assert placed(tmp_path) == [
        ("tj-node-0-0", 0), ("tj-node-0-0", 1), ("tj-node-0-1", 0), ("tj-node-0-1", 1),
    ]  # fmt: skip
    assert {v["env"]["K_MPI_JOB_ROLE"] for v in views(tmp_path)} == {None}  # type: ignore[index]


def test_volcano_mpi_host_shares_the_workers_evenly(pods_of: MakePods, tmp_path: Path) -> None:
    pods = pods_of(volcano("vj", 2))
    done = launch(pods, "--print-topology", "--num-replicas", "2", PY, VIEW, str(tmp_path))
    assert done.returncode == 0, done.stdout
    assert "Volcano" in done.stdout and "MPI_HOST" in done.stdout, done.stdout
    assert placed(tmp_path) == [("vj-worker-0", 0), ("vj-worker-1", 0)], done.stdout


# --- d): the start race -------------------------------------------------------------------


def test_a_worker_whose_sshd_starts_late_is_waited_for(clean_pj: Pods, tmp_path: Path) -> None:
    """pj-worker-1's sshd starts 3 s after poprun (and not before poprun said it waits)."""
    clean_pj.stop_sshd("pj-worker-1")
    began = time.monotonic()
    try:
        proc = start(clean_pj, poprun_argv("--num-replicas", "4", PY, VIEW, str(tmp_path)))
        seen: list[str] = []
        line = wait_for_line(proc, "poprun: waiting for", seen)
        assert line is not None and "pj-worker-1" in line, "".join(seen)
        while time.monotonic() < began + 3.0:  # the scenario: a worker 3 s late
            time.sleep(0.05)
    finally:
        clean_pj.start_sshd("pj-worker-1")
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(seen) + rest
    assert sum("poprun: waiting for" in x for x in [*seen, *rest.splitlines()]) == 1
    assert [h for h, _ in placed(tmp_path)] == ["pj-worker-0"] * 2 + ["pj-worker-1"] * 2


def test_a_worker_that_never_answers_is_one_error_line_after_ssh_wait(
    clean_pj: Pods, tmp_path: Path
) -> None:
    clean_pj.stop_sshd("pj-worker-1")
    try:
        done = launch(
            clean_pj, "--ssh-wait", "3", "--num-replicas", "4",
            "/bin/sh", "-c", f"touch {tmp_path / 'ran'}",
        )  # fmt: skip
    finally:
        clean_pj.start_sshd("pj-worker-1")
    assert done.returncode == 2, done.stdout
    errors = [line for line in done.stdout.splitlines() if line.startswith("poprun: error:")]
    assert len(errors) == 1 and "pj-worker-1" in errors[0] and "--ssh-wait" in errors[0], errors
    assert not (tmp_path / "ran").exists()


# --- e) f): pod deletion, PID 1 ---------------------------------------------------------------


def _until_sleeping(pods: Pods, proc: subprocess.Popen[str], count: int) -> list[str]:
    seen: list[str] = []
    while sum("up on " in line for line in seen) < count:
        assert wait_for_line(proc, "up on ", seen) is not None, "".join(seen)
    deadline = time.monotonic() + 10.0
    while sum(sleepers(pods, w) for w in pods.layout.workers) < count:
        assert time.monotonic() < deadline, pods.hosts.leftovers()
        time.sleep(0.05)
    return seen


def test_sigterm_from_a_pod_deletion_ends_the_job_on_every_pod_exit_143(clean_pj: Pods) -> None:
    proc = start(clean_pj, poprun_argv("--num-replicas", "4", *SLEEP))
    seen = _until_sleeping(clean_pj, proc, 4)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, "".join(seen) + rest
    assert clean_pj.hosts.wait_clean(within=10.0) == {}


def test_sigterm_grace_saves_a_checkpoint_at_the_notice_then_ends(
    clean_pj: Pods, tmp_path: Path
) -> None:
    """With ``--sigterm-grace`` the SIGTERM is the save-now notice: each instance (both on
    pj-worker-0, its 2 slots) waits after step 4 for it, saves, stops; exit 143."""
    program = [PY, str(BIN / "ckpt_notice.py"), "notice", str(tmp_path)]
    args = ["--sigterm-grace", "60", "--num-instances", "2", "--num-replicas", "4"]
    proc = start(clean_pj, poprun_argv(*args, *program))
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"waiting.{i}").exists() for i in range(2)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert "SAVED 0 4" in out and "SAVED 1 4" in out, out
    assert (tmp_path / "ckpt.pt").exists()
    assert "--sigterm-grace passed" not in out, out  # they stopped by themselves, in time


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _zombies(pid: int) -> set[int]:
    found = set()
    for child in _children(pid):
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            found.add(child)
    return found


def test_poprun_as_the_containers_pid_1(clean_pj: Pods, tmp_path: Path) -> None:
    """``unshare --pid --fork --mount-proc``: poprun is PID 1 of the launcher's own pid
    namespace. What ends under it is reaped (no zombie stays), and SIGTERM, which the kernel
    delivers to a PID 1 only where it has a handler, ends the job: exit 143."""
    pid1 = ["unshare", "--pid", "--fork", "--mount-proc"]
    done = run_job(
        clean_pj.on_launcher([*pid1, *poprun_argv("--num-replicas", "4", PY, VIEW, str(tmp_path))]),
        env=clean_pj.launcher_env(job_env()),
    )
    assert done.returncode == 0, done.stdout
    assert len(views(tmp_path)) == 4
    proc = start(clean_pj, [*pid1, *poprun_argv("--num-replicas", "4", *SLEEP)])
    seen = _until_sleeping(clean_pj, proc, 4)
    poprun = _children(proc.pid)  # unshare's child: poprun, PID 1 in its namespace
    assert len(poprun) == 1, poprun
    status = Path(f"/proc/{poprun[0]}/status").read_text()
    nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
    assert nspid.split()[-1] == "1", nspid  # its pid in its own (innermost) namespace
    first = _zombies(poprun[0])
    time.sleep(2.0)  # a zombie seen twice, 2 s apart, is one PID 1 did not reap
    assert first & _zombies(poprun[0]) == set()
    os.kill(poprun[0], signal.SIGTERM)  # to poprun itself: unshare ignores it, passes nothing on
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, "".join(seen) + rest
    assert clean_pj.hosts.wait_clean(within=10.0) == {}


# --- h) j): /dev/shm, the v1 agent ------------------------------------------------------------


def test_a_64_mib_dev_shm_in_the_workers_runs_a_job(clean_pj: Pods, tmp_path: Path) -> None:
    for worker in clean_pj.layout.workers:
        df = subprocess.run(
            clean_pj.hosts.on(worker, ["df", "-k", "--output=size", "/dev/shm"]),
            capture_output=True, text=True,
        )  # fmt: skip
        assert df.stdout.split()[-1] == str(64 * 1024), df.stdout
    done = launch(
        clean_pj, "--num-replicas", "4", PY, str(BIN / "popdist_instance.py"), str(tmp_path)
    )
    assert done.returncode == 0, done.stdout
    assert len(list(tmp_path.glob("instance-*.json"))) == 4, done.stdout


def test_the_v1_operators_kubexec_agent_is_used_without_an_ssh_check(
    clean_pj: Pods, tmp_path: Path
) -> None:
    """``OMPI_MCA_plm_rsh_agent=/etc/mpi/kubexec.sh`` (v1 ran ``kubectl exec``; this one
    goes over the pods' ssh): not ssh, so poprun runs no check and hands the agent over as
    it is (no ``ControlPath`` of the check's masters)."""
    log = tmp_path / "kubexec.log"
    shim = f'#!/bin/sh\necho "$*" >> {log}\npod=$1\nshift\nexec ssh "$pod" "$@"\n'
    for pod in clean_pj.layout.pods:  # Open MPI's daemons spawn on through it (tree spawn)
        clean_pj.hosts.write(pod, "/etc/mpi/kubexec.sh", shim, 0o555)
    out = tmp_path / "views"
    out.mkdir()
    done = launch(
        clean_pj, "--num-replicas", "4", PY, VIEW, str(out), "OMPI_MCA_plm_rsh_agent",
        OMPI_MCA_plm_rsh_agent="/etc/mpi/kubexec.sh",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert [h for h, _ in placed(out)] == ["pj-worker-0"] * 2 + ["pj-worker-1"] * 2
    agents = {v["env"]["OMPI_MCA_plm_rsh_agent"] for v in views(out)}  # type: ignore[index]
    assert agents == {"/etc/mpi/kubexec.sh"}, agents
    assert "orted" in log.read_text()


# --- PBS and LSF on h1-h3 ---------------------------------------------------------------------


def pbs_env(hosts: Hosts, directory: Path, nodes: list[str], **extra: str) -> dict[str, str]:
    """A PBS job's environment on its first node (PBS Pro's and Torque's variables)."""
    nodefile = directory / "17.srv"
    nodefile.write_text("".join(f"{n}\n" for n in nodes))
    env = job_env(
        PBS_JOBID="17.srv", PBS_ENVIRONMENT="PBS_BATCH", PBS_NODEFILE=str(nodefile),
        PBS_O_WORKDIR=str(ROOT), PBS_QUEUE="workq", PBS_NODENUM="0", PBS_TASKNUM="1",
        PBS_VNODENUM="0", PBS_MOMPORT="15003", PBS_NUM_NODES=str(len(set(nodes))),
        PBS_NUM_PPN=str(nodes.count(nodes[0])), PBS_NP=str(len(nodes)), HOSTNAME=nodes[0],
    )  # fmt: skip
    return hosts.env({**env, **extra})


def lsf_env(directory: Path, nodes: list[str], blaunch: str, **extra: str) -> dict[str, str]:
    """An LSF job's environment on its first host; ``blaunch``: a stand-in's directory
    (``LSF_BINDIR``, first on ``PATH``), or "" for none."""
    hostfile = directory / "4242.hostfile"
    hostfile.write_text("".join(f"{n}\n" for n in nodes))
    counts = {n: nodes.count(n) for n in dict.fromkeys(nodes)}
    env = job_env(
        LSB_JOBID="4242", LSB_DJOB_HOSTFILE=str(hostfile), LSB_HOSTS=" ".join(nodes),
        LSB_MCPU_HOSTS=" ".join(f"{h} {n}" for h, n in counts.items()),
        LSB_DJOB_RANKFILE=str(hostfile), LSB_DJOB_NUMPROC=str(len(nodes)),
        LSB_BIND_CPU_LIST="0,1", LS_EXEC_T="START", HOSTNAME=nodes[0],
    )  # fmt: skip
    if blaunch:
        env.update(LSF_BINDIR=blaunch, PATH=f"{blaunch}:{env['PATH']}")
    env.update(extra)
    return env


def blaunch_shim(hosts: Hosts, directory: Path) -> tuple[Path, Path]:
    """A stand-in ``blaunch HOST COMMAND``: logs its arguments, then runs COMMAND on HOST
    over the hosts' ssh. (directory holding it, its log)."""
    bindir, log = directory / "lsf-bin", directory / "blaunch.log"
    bindir.mkdir()
    shim = bindir / "blaunch"
    shim.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {hosts.ssh_wrapper} "$@"\n')
    shim.chmod(0o755)
    return bindir, log


def poprun_on_h1(hosts: Hosts, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_job(hosts.on("h1", poprun_argv(*args), cwd=str(ROOT)), env=env, timeout=180)


def test_pbs_node_file_gives_the_hosts_and_their_slots(clean_hosts: Hosts, tmp_path: Path) -> None:
    env = pbs_env(clean_hosts, tmp_path, ["h1", "h1", "h2", "h2"])
    out = tmp_path / "views"
    out.mkdir()
    done = poprun_on_h1(
        clean_hosts, env, "--print-topology", "--num-replicas", "4", PY, VIEW, str(out)
    )
    assert done.returncode == 0, done.stdout
    assert "PBS" in done.stdout and "PBS_NODEFILE" in done.stdout, done.stdout
    assert placed(out) == [("h1", 0), ("h1", 1), ("h2", 0), ("h2", 1)], done.stdout
    outside = poprun_on_h1(clean_hosts, env, "-H", "h1,h3", "--num-replicas", "2", "true")
    assert outside.returncode == 2, outside.stdout
    errors = [line for line in outside.stdout.splitlines() if line.startswith("poprun: error:")]
    assert len(errors) == 1 and "h3" in errors[0], outside.stdout


def test_lsf_starts_the_daemons_through_blaunch(clean_hosts: Hosts, tmp_path: Path) -> None:
    """No ``OMPI_MCA_plm_rsh_agent``: only the stand-in ``blaunch`` reaches h2."""
    bindir, log = blaunch_shim(clean_hosts, tmp_path)
    env = lsf_env(tmp_path, ["h1", "h1", "h2", "h2"], str(bindir))
    out = tmp_path / "views"
    out.mkdir()
    done = poprun_on_h1(
        clean_hosts, env, "--print-topology", "--num-replicas", "4",
        PY, VIEW, str(out), "OMPI_MCA_plm_rsh_agent",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert "LSF" in done.stdout and "blaunch" in done.stdout, done.stdout
    assert placed(out) == [("h1", 0), ("h1", 1), ("h2", 0), ("h2", 1)], done.stdout
    assert "orted" in log.read_text() and "h2" in log.read_text()
    without = poprun_on_h1(
        clean_hosts, clean_hosts.env(lsf_env(tmp_path, ["h1", "h2"], "")),
        "--dry-run", "--num-replicas", "2", "true",
    )  # fmt: skip
    assert without.returncode == 0, without.stdout
    assert "ssh (no blaunch" in without.stdout, without.stdout


# --- g): what reaches a remote instance -------------------------------------------------------

#: Per engine: what it sets on the launch host that describes that host alone (it must not
#: reach another host's instance with the launch host's value), and what describes the job
#: (it must: with the launch host's value).
NODE_ONLY = {
    "Kubernetes MPIJob": ["HOSTNAME", "K_MPI_JOB_ROLE", "NVIDIA_VISIBLE_DEVICES",
                          "NVIDIA_DRIVER_CAPABILITIES"],
    "PBS": ["HOSTNAME", "PBS_NODEFILE", "PBS_NODENUM", "PBS_TASKNUM", "PBS_VNODENUM",
            "PBS_MOMPORT"],
    "LSF": ["HOSTNAME", "LSB_DJOB_HOSTFILE", "LSB_DJOB_RANKFILE", "LSB_DJOB_NUMPROC",
            "LSB_BIND_CPU_LIST", "LS_EXEC_T"],
}  # fmt: skip
JOB_WIDE = {
    "Kubernetes MPIJob": ["MY_SETTING", "KUBERNETES_SERVICE_HOST"],
    "PBS": ["MY_SETTING", "PBS_JOBID", "PBS_ENVIRONMENT", "PBS_NP"],
    "LSF": ["MY_SETTING", "LSB_JOBID", "LSB_MCPU_HOSTS"],
}


@pytest.mark.parametrize("engine", list(NODE_ONLY))
def test_what_each_engine_sets_and_what_reaches_a_remote_instance(
    engine: str, clean_pj: Pods, clean_hosts: Hosts, tmp_path: Path
) -> None:
    names = [*NODE_ONLY[engine], *JOB_WIDE[engine]]
    out = tmp_path / "views"
    out.mkdir()
    program = [PY, VIEW, str(out), *names]
    if engine == "Kubernetes MPIJob":
        env = clean_pj.launcher_env(job_env(MY_SETTING="job-wide"))
        done = run_job(clean_pj.on_launcher(poprun_argv("--num-replicas", "4", *program)), env=env)
        remote = set(clean_pj.layout.workers)  # every instance: the launcher runs none
    else:
        nodes = ["h1", "h1", "h2", "h2"]
        if engine == "PBS":
            env = pbs_env(clean_hosts, tmp_path, nodes, MY_SETTING="job-wide")
        else:
            env = lsf_env(tmp_path, nodes, str(blaunch_shim(clean_hosts, tmp_path)[0]),
                          MY_SETTING="job-wide")  # fmt: skip
        done = poprun_on_h1(clean_hosts, env, "--num-replicas", "4", *program)
        remote = {"h2"}
    assert done.returncode == 0, done.stdout
    seen = [v for v in views(out) if v["host"] in remote]
    assert len(seen) == (4 if engine.startswith("Kubernetes") else 2), done.stdout
    for v in seen:
        got = v["env"]
        assert isinstance(got, dict)
        leaked = {n: got[n] for n in NODE_ONLY[engine] if got[n] is not None and got[n] == env[n]}
        assert leaked == {}, f"{engine}: the launch host's own values reached {v['host']}"
        assert {n: got[n] for n in JOB_WIDE[engine]} == {n: env[n] for n in JOB_WIDE[engine]}
