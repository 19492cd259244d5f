"""Cluster engines as host sources (issue 52): each engine's variables and files in, the
plan, the launch mechanics and what is forwarded out. No cluster: every test is the
environment an engine gives a job (as its sources document it), its files in a temporary
directory."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from poprun.config import run_config as cfg
from poprun.errors import PoprunError
from poprun.plan import hosts as hosts_module
from poprun.plan.engines import hostfile
from poprun.plan.engines.detect import detect
from poprun.plan.environment import forwarded_names
from poprun.plan.mpirun import build_argv
from poprun.plan.topology import plan, render
from poprun.run import ssh_check
from poprun.run.ending import Do, EndingPolicy, Evidence
from poprun.run.time_limit import NOTICE_SIGNAL
from tests.support.fakes import Clock, instances

pytestmark = pytest.mark.unit

BASE = {"PATH": "/usr/bin:/bin", "HOME": "/root"}


def _config(environ: dict[str, str], **cli: Any) -> cfg.RunConfig:
    cli.setdefault("num_replicas", "4")
    return cfg.build(cli, ("/usr/bin/python3", "train.py"), environ)


def _argv(config: cfg.RunConfig) -> list[str]:
    return build_argv(
        config, plan(config), mpirun="mpirun", forwarded=[], is_root=False, local_cpus=2
    )


def _mpijob(tmp_path: Path, lines: str, **extra: str) -> dict[str, str]:
    """A Kubeflow MPI Operator v2 launcher pod's environment and /etc/mpi/hostfile."""
    path = tmp_path / "hostfile"
    path.write_text(lines)
    return {
        **BASE,
        "HOSTNAME": "pj-launcher",
        "K_MPI_JOB_ROLE": "launcher",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "OMPI_MCA_orte_default_hostfile": str(path),
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_set_default_slots": "2",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        "NVIDIA_VISIBLE_DEVICES": "",
        **extra,
    }


WORKERS = "pj-worker-0.pj.default.svc slots=2\npj-worker-1.pj.default.svc slots=2\n"


# --- the host-file grammar ------------------------------------------------------------------


def test_open_mpis_host_file_format_is_read_with_its_slots() -> None:
    text = (
        "# the job's hosts\n"
        "node1 slots=2 max_slots=4\n"
        "node2:3            # Intel MPI / MPICH\n"
        "\n"
        "node3 cpu=1\n"
        "node1 slots=1      # a second queue on node1: the slots add up\n"
    )
    listed = hostfile.parse(text, "--host-file", "h.txt")
    assert listed == hostfile.FileHosts(("node1", "node2", "node3"), (3, 3, 1), (4, 0, 0), True)


def test_poprun_s_own_format_is_a_plain_list_and_a_node_file_counts_its_lines() -> None:
    plain = hostfile.parse("a\nb  # rack 2\n", "--host-file", "h")
    assert plain.hosts == ("a", "b") and not plain.slotted
    per_slot = hostfile.parse("n1\nn1\nn2\nn1\n", "PBS_NODEFILE", "/var/spool/nodefile")
    assert per_slot == hostfile.FileHosts(("n1", "n2"), (3, 1), (0, 0), True)
    defaulted = hostfile.parse("w0\nw1 slots=4\n", "X", "f", default_slots=2)
    assert defaulted.slots == (2, 4) and defaulted.slotted


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a slots=2\nb fast\n", ["--host-file=f.txt:2", "'b fast' is in neither"]),
        ("a slots=0\n", ["--host-file=f.txt:1", "slots '0' is not a positive whole number"]),
        ("a slots=two\n", ["slots 'two' is not a positive whole number"]),
        ("a slots=\u00b2\n", ["slots '\u00b2' is not a positive whole number"]),  # no traceback
        ("a slots=2 max_slots=0\n", ["max_slots '0' is not a positive whole number"]),
        ("a colour=red\n", ["colour= is not a host-file setting poprun knows"]),
        ("a:0\n", ["slots '0' is not a positive"]),
        ("# only comments\n", ["--host-file=f.txt: lists no hosts"]),
    ],
)
def test_a_bad_host_file_line_is_one_line_naming_the_file_and_line(
    text: str, words: list[str]
) -> None:
    with pytest.raises(PoprunError) as caught:
        hostfile.parse(text, "--host-file", "f.txt")
    message = str(caught.value)
    assert "\n" not in message and all(word in message for word in words), message


def test_host_file_in_open_mpis_format_fills_hosts_by_slots(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("n1 slots=2\nn2 slots=2\n")
    config = _config(BASE, host_file=str(path))
    assert config.num_instances == 4  # one instance per slot, as mpirun would run
    assert (config.hosts, config.host_counts) == (("n1", "n2"), (2, 2))
    config = _config(BASE, host_file=str(path), num_instances="3", num_replicas="3")
    assert (config.hosts, config.host_counts) == (("n1", "n2"), (2, 1))
    with pytest.raises(PoprunError) as caught:
        _config(BASE, host_file=str(path), num_instances="6", num_replicas="6")
    assert str(caught.value).startswith(
        f"--num-instances=6: is more than the 4 slots of host file (2 hosts, 4 slots, "
        f"--host-file={path})"
    )
    over = _config(
        BASE, host_file=str(path), num_instances="6", num_replicas="6",
        mpi_global_args=["--oversubscribe"],
    )  # fmt: skip
    assert over.host_counts == (4, 2)  # a second round fills the hosts by their slots again


# --- Kubernetes -----------------------------------------------------------------------------


def test_an_mpijob_launcher_plans_on_its_workers_from_the_host_file(tmp_path: Path) -> None:
    """Issue 52: poprun used to plan a one-host job there while mpirun placed the instances
    on the workers of the default host file."""
    config = _config(_mpijob(tmp_path, WORKERS), num_instances="2", num_replicas="4")
    topology = plan(config)
    hosts = ("pj-worker-0.pj.default.svc", "pj-worker-1.pj.default.svc")
    assert (config.hosts, config.host_counts) == (hosts[:1], (2,))  # filled by slots
    assert [p.host for p in topology.instances] == [hosts[0], hosts[0]]
    assert config.allocation is not None
    assert config.allocation.engine == "Kubernetes MPIJob (MPI Operator v2)"
    argv = _argv(config)
    assert f"{hosts[0]}:2" in argv  # the names verbatim: -H is a filter over the file
    assert "plm_rsh_agent" not in argv  # plain ssh, as the operator's pod has it
    shown = render(topology)
    assert "Kubernetes MPIJob (MPI Operator v2): hosts from OMPI_MCA_orte_default_hostfile" in shown
    everyone = _config(_mpijob(tmp_path, WORKERS), num_replicas="4")
    assert everyone.num_instances == 4 and everyone.host_counts == (2, 2)


def test_the_launcher_that_is_also_a_worker_is_this_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "pj-launcher")
    listed = "pj-launcher.pj.default.svc slots=1\n" + WORKERS
    config = _config(_mpijob(tmp_path, listed), num_instances="3", num_replicas="3")
    assert hosts_module.is_local("pj-launcher.pj.default.svc")
    assert not hosts_module.is_local("pj-worker-0.pj.default.svc")
    remote = [h for h in config.hosts if not hosts_module.is_local(h)]
    assert remote == ["pj-worker-0.pj.default.svc"]  # no ssh to itself


def test_names_in_etc_hosts_for_this_hosts_addresses_are_this_host(tmp_path: Path) -> None:
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n127.0.1.1 node7-ib node7-ib.cluster  # alias\n")
    names = hosts_module.local_names.__wrapped__(str(hosts_file))
    assert {"node7-ib", "node7-ib.cluster", "localhost"} <= names


def test_a_trainjob_and_volcano_are_named_and_read(tmp_path: Path) -> None:
    trainjob = _mpijob(tmp_path, "tj-node-0-0.tj slots=2\ntj-node-0-1.tj slots=2\n")
    del trainjob["K_MPI_JOB_ROLE"]
    config = _config(trainjob)
    assert config.allocation is not None
    assert config.allocation.engine == "Kubernetes TrainJob (Trainer v2, MPI runtime)"
    assert config.hosts == ("tj-node-0-0.tj", "tj-node-0-1.tj")
    pod = {**BASE, "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    volcano = {**pod, "MPI_HOST": "vj-worker-0.vj,vj-worker-1.vj"}
    config = _config(volcano, num_replicas="2")
    assert config.hosts == ("vj-worker-0.vj", "vj-worker-1.vj") and config.host_counts == (1, 1)
    config = _config(volcano, num_instances="4", num_replicas="4")
    assert config.host_counts == (2, 2)  # no slots: shared evenly, as -H
    # named inside the job: no slot counts to check them against, shared evenly too
    config = _config(volcano, host=["vj-worker-0.vj,vj-worker-1.vj"], num_instances="4",
                     num_replicas="4")  # fmt: skip
    assert config.host_counts == (2, 2)
    # MPI_HOST is a common name: outside a pod it is not Volcano's, and the run is local
    assert _config({**BASE, "MPI_HOST": "a,b"}, num_replicas="2").allocation is None


def test_an_engine_present_without_a_job_gives_way_to_the_next(tmp_path: Path) -> None:
    """Open MPI's own default host file named with --mca is no job: Volcano's hosts are."""
    volcano = {**BASE, "KUBERNETES_SERVICE_HOST": "10.96.0.1", "MPI_HOST": "w0,w1"}
    default = ["--mca orte_default_hostfile /etc/openmpi/openmpi-default-hostfile"]
    config = _config(volcano, num_replicas="2", mpi_global_args=default)
    assert config.allocation is not None and config.hosts == ("w0", "w1")
    assert config.engine_note == ""  # the host file found no job: not named as another
    # a blank variable sets nothing: a blank PE_HOSTFILE hides no Slurm job
    slurm = {**BASE, "PE_HOSTFILE": " ", "JOB_ID": "3", "SLURM_JOB_ID": "9",
             "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}  # fmt: skip
    config = _config(slurm, num_replicas="2")
    assert config.allocation is not None and config.allocation.engine == "Slurm"
    assert config.engine_note == ""


# --- PBS, LSF, Grid Engine ------------------------------------------------------------------


def _file(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_pbs_job_gives_its_node_file_s_slots_in_order(tmp_path: Path) -> None:
    env = {
        **BASE, "PBS_JOBID": "17.srv", "PBS_ENVIRONMENT": "PBS_BATCH",
        "PBS_NODEFILE": _file(tmp_path, "nodes", "c2\nc2\nc1\nc1\n"),
        "PBS_NUM_NODES": "2", "PBS_NUM_PPN": "2", "PBS_NODENUM": "0",
    }  # fmt: skip
    config = _config(env)
    assert (config.hosts, config.host_counts) == (("c2", "c1"), (2, 2))
    assert config.allocation is not None and config.allocation.launcher.ssh
    assert "PBS job 17.srv: hosts from PBS_NODEFILE=" in render(plan(config))
    with pytest.raises(PoprunError, match=r"PBS_JOBID=9\.srv: is set but PBS_NODEFILE is not"):
        _config({**BASE, "PBS_JOBID": "9.srv"})


def test_an_lsf_job_starts_daemons_through_blaunch_where_it_is(tmp_path: Path) -> None:
    env = {**BASE, "LSB_JOBID": "4242", "LSB_MCPU_HOSTS": "hostA 2 hostB 2"}
    read = Path.read_text

    def found(name: str) -> str | None:
        return "/opt/lsf/bin/blaunch" if name.endswith("blaunch") else None

    allocation, _ = detect(env, (), lambda v, p: read(Path(p)), found, lambda i, s, w: [i])
    assert allocation is not None and allocation.launcher.name == "blaunch"
    assert allocation.launcher.agent == "/opt/lsf/bin/blaunch" and not allocation.launcher.ssh
    assert "through /opt/lsf/bin/blaunch" in allocation.announce
    assert ssh_check.launched_by_scheduler(env, [], allocation.launcher.ssh)
    without, _ = detect(env, (), lambda v, p: read(Path(p)), lambda name: None, lambda i, s, w: [i])
    assert without is not None and without.launcher.ssh
    assert "through ssh (no blaunch" in without.announce
    files = {**env, "LSB_DJOB_HOSTFILE": _file(tmp_path, "djob", "hostA\nhostA\nhostB\n")}
    via_file, _ = detect(files, (), lambda v, p: read(Path(p)), found, lambda i, s, w: [i])
    assert via_file is not None and (via_file.nodes, via_file.tasks) == (("hostA", "hostB"), (2, 1))


def test_lsfs_blaunch_is_the_agent_in_mpiruns_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blaunch = tmp_path / "blaunch"
    blaunch.write_text("#!/bin/sh\n")
    blaunch.chmod(0o755)
    env = {**BASE, "LSB_JOBID": "4242", "LSB_MCPU_HOSTS": "hostA 2 hostB 2",
           "LSF_BINDIR": str(tmp_path)}  # fmt: skip
    argv = _argv(_config(env))
    at = argv.index("plm_rsh_agent")
    assert argv[at - 1 : at + 2] == ["--mca", "plm_rsh_agent", str(blaunch)]


def test_a_grid_engine_job_takes_open_mpis_own_qrsh_path(tmp_path: Path) -> None:
    lines = "g1 2 all.q@g1 UNDEFINED\ng2 1 all.q@g2 UNDEFINED\ng2 1 big.q@g2 UNDEFINED\n"
    env = {**BASE, "JOB_ID": "31", "PE_HOSTFILE": _file(tmp_path, "pe", lines),
           "SGE_ROOT": "/var/lib/gridengine", "ARC": "lx-amd64", "NSLOTS": "4"}  # fmt: skip
    config = _config(env)
    assert (config.hosts, config.host_counts) == (("g1", "g2"), (2, 2))
    allocation = config.allocation
    assert allocation is not None and allocation.launcher.name == "qrsh -inherit"
    argv = _argv(config)
    assert "plm_rsh_agent" not in argv  # an agent would switch Open MPI's qrsh path off
    assert ssh_check.launched_by_scheduler(env, [], allocation.launcher.ssh)  # no ssh check
    assert allocation.launcher.probe[:2] == ("/var/lib/gridengine/bin/lx-amd64/qrsh", "-inherit")
    chosen = _config({**env, "OMPI_MCA_plm_rsh_agent": "ssh"})  # the user's agent: ssh
    assert chosen.allocation is not None and chosen.allocation.launcher.ssh
    with pytest.raises(PoprunError, match=r"PE_HOSTFILE=.*pe:1: 'g1 two"):
        _config({**env, "PE_HOSTFILE": _file(tmp_path, "pe", "g1 two all.q\n")})


def test_two_engines_at_once_one_line_says_which_was_taken(tmp_path: Path) -> None:
    env = {
        **BASE, "JOB_ID": "31", "PE_HOSTFILE": _file(tmp_path, "pe", "g1 2 all.q UNDEFINED\n"),
        "PBS_JOBID": "17.srv", "PBS_NODEFILE": _file(tmp_path, "nodes", "c1\n"),
    }  # fmt: skip
    config = _config(env, num_replicas="2")
    assert config.allocation is not None and config.allocation.engine == "Grid Engine"
    assert config.engine_note.startswith(
        "poprun: this run is inside Grid Engine's job (PE_HOSTFILE) and also has PBS "
        "(PBS_JOBID) set: using Grid Engine's hosts; poprun takes them in Open MPI's order"
    )
    assert "\n" not in config.engine_note


@pytest.mark.parametrize(
    ("engine", "environ", "host"),
    [
        ("PBS", {"PBS_JOBID": "17.srv", "PBS_NODEFILE": "c1\nc1\n"}, "c9"),
        ("Grid Engine", {"JOB_ID": "31", "PE_HOSTFILE": "g1 2 all.q UNDEFINED\n"}, "g9"),
        ("LSF", {"LSB_JOBID": "7", "LSB_MCPU_HOSTS": "hostA 2"}, "hostZ"),
    ],
)
def test_a_host_the_allocation_does_not_hold_is_refused(
    tmp_path: Path, engine: str, environ: dict[str, str], host: str
) -> None:
    env = dict(BASE)
    for name, value in environ.items():
        env[name] = _file(tmp_path, name, value) if "\n" in value else value
    with pytest.raises(PoprunError) as caught:
        _config(env, host=[host], num_instances="1", num_replicas="1")
    message = str(caught.value)
    assert message.startswith(f"--host={host}: is not a node of {engine}") and "\n" not in message


# --- what reaches the other hosts -----------------------------------------------------------


ENGINES: dict[str, dict[str, str]] = {
    "MPIJob": {"HOSTNAME": "pj-launcher", "K_MPI_JOB_ROLE": "launcher",
               "NVIDIA_VISIBLE_DEVICES": "", "KUBERNETES_SERVICE_HOST": "10.96.0.1"},
    "PBS": {"PBS_JOBID": "17.srv", "PBS_NODENUM": "0", "PBS_TASKNUM": "1",
            "PBS_VNODENUM": "0", "PBS_O_WORKDIR": "/home/u"},
    "LSF": {"LSB_JOBID": "7", "LSB_DJOB_RANKFILE": "/tmp/rank", "LSB_BIND_CPU_LIST": "0-3"},
    "Grid Engine": {"JOB_ID": "31", "QUEUE": "all.q", "TMPDIR": "/tmp/31.1.all.q"},
}  # fmt: skip
#: What each engine sets that describes the launch node only.
LOCAL = {
    "MPIJob": {"HOSTNAME", "K_MPI_JOB_ROLE", "NVIDIA_VISIBLE_DEVICES"},
    "PBS": {"PBS_NODEFILE", "PBS_NODENUM", "PBS_TASKNUM", "PBS_VNODENUM"},
    "LSF": {"LSB_DJOB_HOSTFILE", "LSB_DJOB_RANKFILE", "LSB_BIND_CPU_LIST"},
    "Grid Engine": {"PE_HOSTFILE", "QUEUE", "TMPDIR"},
}


@pytest.mark.parametrize("engine", list(ENGINES))
def test_the_launchers_identity_and_per_node_variables_are_never_forwarded(
    tmp_path: Path, engine: str
) -> None:
    env = {**BASE, **ENGINES[engine], "TRAINING_SEED": "7"}
    if engine == "MPIJob":
        env = {**_mpijob(tmp_path, WORKERS), **env}
    elif engine == "PBS":
        env["PBS_NODEFILE"] = _file(tmp_path, "nodes", "c1\nc2\n")
    elif engine == "LSF":
        env["LSB_DJOB_HOSTFILE"] = _file(tmp_path, "djob", "hostA\nhostB\n")
    else:
        env["PE_HOSTFILE"] = _file(tmp_path, "pe", "g1 1 all.q UNDEFINED\ng2 1 all.q x\n")
    config = _config(env, num_instances="2", num_replicas="2")
    assert config.allocation is not None
    sent = set(forwarded_names(env, config.allocation.local_only))
    assert "TRAINING_SEED" in sent and "PATH" in sent  # the user's own still go
    assert not LOCAL[engine] & sent, LOCAL[engine] & sent
    assert "HOSTNAME" not in set(forwarded_names({**BASE, "HOSTNAME": "login1"}))


# --- the ssh check waits as mpirun would ------------------------------------------------------


def test_the_ssh_check_tries_a_host_again_until_it_answers_within_the_wait() -> None:
    clock = Clock(0.0)
    answers = {"w0": ["Connection refused", "Connection refused", ""], "w1": [""]}
    said: list[str] = []

    def tries(pending: list[str]) -> dict[str, str]:
        return {host: answers[host].pop(0) for host in pending}

    bad = ssh_check.wait_for(
        ["w0", "w1"], tries, wait_s=60, clock=clock, pause=clock.advance, say=said.append
    )
    assert bad == [] and clock() == 2 * ssh_check.RETRY_S
    assert said == [
        "poprun: waiting for 1 host(s) to answer ssh (w0: Connection refused); trying again "
        "for up to 60 s (--ssh-wait)"
    ]


def test_the_ssh_check_gives_up_after_the_wait_and_never_waits_for_a_refused_key() -> None:
    clock = Clock(0.0)

    def tries(pending: list[str]) -> dict[str, str]:
        return {"late": "ssh: connect to host late port 22: Connection refused",
                "key": "root@key: Permission denied (publickey)."}  # fmt: skip

    calls: list[float] = []

    def counted(pending: list[str]) -> dict[str, str]:
        calls.append(clock())
        return {h: tries(pending)[h] for h in pending}

    bad = ssh_check.wait_for(["key", "late"], counted, wait_s=5, clock=clock, pause=clock.advance)
    assert [host for host, _ in bad] == ["key", "late"]
    assert calls == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # "late" again each second, "key" once
    assert ssh_check.wait_for(["late"], counted, wait_s=0, clock=clock, pause=clock.advance)


def test_the_check_passes_open_mpis_rsh_args_on() -> None:
    env = {"OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10 -p 2222"}
    assert ssh_check.rsh_args([], env) == ["-o", "ConnectionAttempts=10", "-p", "2222"]
    assert ssh_check.rsh_args(["--mca", "plm_rsh_args", "-q"], env) == ["-q"]
    assert ssh_check._attempts(["ssh", "-o", "ConnectionAttempts=10"]) == 10
    assert ssh_check._attempts(["ssh", "-oConnectionAttempts=4"]) == 4
    assert ssh_check._attempts(["ssh", "-o", "ConnectionAttempts 3"]) == 3
    assert ssh_check._attempts(["ssh", "-p", "2222"]) == 1


# --- SIGTERM as the save-now notice (--sigterm-grace) -----------------------------------------


def test_sigterm_with_a_grace_is_the_save_now_notice_then_the_end_as_on_sigterm() -> None:
    clock = Clock()
    policy = EndingPolicy(clock, remote=True, sigterm_grace=20.0)
    policy.launched()
    [notice] = policy.signal_received(15)
    assert notice.do is Do.NOTIFY and notice.signum == NOTICE_SIGNAL
    assert "received SIGTERM (--sigterm-grace=20)" in notice.why
    clock.advance(19.0)
    assert Do.FORWARD not in [a.do for a in policy.due()]
    clock.advance(1.0)
    assert [a.do for a in policy.due()] == [Do.FORWARD]  # still running: SIGTERM now
    policy.mpirun_exited(0)
    policy.streams_closed()
    ending = policy.ending(Evidence(instances(2)))
    assert ending.code == 143 and not ending.restart  # what the scheduler expects
    plain = EndingPolicy(clock, remote=True)
    plain.launched()
    assert [a.do for a in plain.signal_received(15)] == [Do.FORWARD]  # no grace: as before


def test_a_second_signal_in_the_grace_kills_now_and_forwards_nothing_later() -> None:
    clock = Clock()
    policy = EndingPolicy(clock, remote=True, sigterm_grace=20.0)
    policy.launched()
    policy.signal_received(15)
    clock.advance(5.0)
    assert [a.do for a in policy.signal_received(2)] == [Do.KILL_INSTANCES]
    clock.advance(20.0)
    assert Do.FORWARD not in [a.do for a in policy.due()]  # the held-back SIGTERM is gone


def test_across_hosts_each_instance_dies_with_its_daemon_and_node_only_names_are_unset(
    tmp_path: Path,
) -> None:
    """``setpriv --pdeathsig KILL`` before every context's wrapper across hosts (a daemon
    SIGKILLed by a scheduler leaves no instance); under Grid Engine, whose ``qrsh -inherit
    -V`` carries mpirun's environment over, the remote wrapper unsets ``PE_HOSTFILE``."""
    lines = "g1 2 all.q UNDEFINED\ng2 2 all.q UNDEFINED\n"
    env = {**BASE, "JOB_ID": "31", "PE_HOSTFILE": _file(tmp_path, "pe", lines),
           "SGE_ROOT": "/var/lib/gridengine", "ARC": "lx-amd64"}  # fmt: skip
    config = _config(env)
    argv = build_argv(config, plan(config), mpirun="mpirun", forwarded=[], is_root=False,
                      local_cpus=2, setpriv="/usr/bin/setpriv")  # fmt: skip
    assert "POPRUN_PDEATHSIG=/usr/bin/setpriv" in argv and "POPRUN_UNSET=PE_HOSTFILE" in argv
    at = argv.index("/usr/bin/setpriv")
    assert argv[at : at + 4] == ["/usr/bin/setpriv", "--pdeathsig", "KILL", "/bin/sh"]
    alone = _config(BASE, num_instances="2", num_replicas="2")  # one host: nothing added
    argv = build_argv(alone, plan(alone), mpirun="mpirun", forwarded=[], is_root=False,
                      local_cpus=2, setpriv="/usr/bin/setpriv")  # fmt: skip
    assert "/usr/bin/setpriv" not in argv and not any(a.startswith("POPRUN_") for a in argv)


@pytest.mark.parametrize("zero", ["0", "0.0", "0.00", "00", "0e0"])
def test_ssh_wait_zero_in_any_spelling_is_one_try(zero: str) -> None:
    from poprun.config.options import parse_wait

    assert parse_wait("--ssh-wait", zero) == 0.0
    assert parse_wait("--ssh-wait", "2.5") == 2.5
    with pytest.raises(PoprunError, match=r"^--ssh-wait=-1"):
        parse_wait("--ssh-wait", "-1")


def test_qrsh_switched_off_only_by_a_true_value(tmp_path: Path) -> None:
    env = {**BASE, "JOB_ID": "31", "PE_HOSTFILE": _file(tmp_path, "pe", "g1 2 all.q UNDEFINED\n"),
           "SGE_ROOT": "/var/lib/gridengine", "ARC": "lx-amd64"}  # fmt: skip
    kept = _config(env, mpi_global_args=["--mca plm_rsh_disable_qrsh 0"], num_replicas="2")
    assert kept.allocation is not None and kept.allocation.launcher.name == "qrsh -inherit"
    off = _config(env, mpi_global_args=["--mca plm_rsh_disable_qrsh 1"], num_replicas="2")
    assert off.allocation is not None and off.allocation.launcher.ssh


def test_an_interrupted_ssh_check_ends_its_running_tries_and_returns_at_once() -> None:
    """Ctrl-C while a try runs: ``on_abort`` ends the running ones (their process groups,
    in the check) and the pool does not wait out their time-outs."""
    import threading
    import time as clock

    b_running, aborted = threading.Event(), threading.Event()
    ended: dict[str, bool] = {}

    def one(host: str) -> str:
        if host == "a":
            b_running.wait(5.0)
            raise KeyboardInterrupt  # as Interrupted reaches the check
        if host == "b":
            b_running.set()
            ended["b"] = aborted.wait(60.0)  # a 60 s try, ended by the abort
        return ""

    start = clock.monotonic()
    with pytest.raises(KeyboardInterrupt):
        ssh_check.run_all(["a", "b", "c", "d"], one, concurrency=2, on_abort=aborted.set)
    assert ended == {"b": True} and clock.monotonic() - start < 5.0
