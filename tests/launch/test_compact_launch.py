"""The compact launch (issue 53), run for real: the instance wrapper's shell arithmetic
against the per-instance values it replaced, and 128 light instances on this host."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from poprun.config import run_config as cfg
from poprun.plan import compact
from poprun.plan.environment import instance_values
from poprun.plan.mpirun import EXIT_MARKER, INSTANCE_WRAPPER, PID_MARKER, build_argv, find_setpriv
from poprun.plan.topology import on_hosts, plan
from tests.support.gate import Gate
from tests.support.jobs import ROOT, assert_no_descendants, job_env, poprun_argv

pytestmark = pytest.mark.launch

GATHERED = str(ROOT / "tests" / "bin" / "gathered.sh")
ENV = {"PATH": "/usr/bin:/bin"}
#: Each rank in a subshell: the wrapper's arithmetic, then what it exported and the argv.
HARNESS = (
    'for _r in $RANKS; do (OMPI_COMM_WORLD_RANK=$_r; {derive} echo "rank $_r"; '
    "env | grep -E '^(POPDIST_|CUDA_VISIBLE_DEVICES=)'; echo \"argv $*\"); done"
)


def _config(**cli: object) -> cfg.RunConfig:
    return cfg.build(cli, ("/bin/true",), ENV)


def _cases() -> list[tuple[str, cfg.RunConfig, dict[str, int] | None, tuple[str, ...] | None]]:
    four = _config(num_instances="8", num_replicas="8", host=["h[1-4]"])
    return [
        ("one host, 3x2x2", _config(num_instances="3", num_replicas="6", ipus_per_replica="2"),
         None, None),
        ("one host, a pool", _config(num_instances="4", num_replicas="8"), None,
         ("4", "5", "6", "7", "8", "9")),
        ("no devices", _config(num_instances="2", num_replicas="2"), None, ()),
        ("hosts around this one", _config(num_instances="9", num_replicas="18",
                                          host=["a,localhost,c"]), None, None),
        ("uneven split", on_hosts(four, ("h1", "h3", "h4")), None, None),
        ("numa", _config(num_instances="6", num_replicas="6"), {"localhost": 4}, None),
        ("instance args", _config(num_instances="4", num_replicas="4", host=["a,b"],
                                  instance_mpi_local_args=["2:--wdir /tmp"]), None, None),
    ]  # fmt: skip


def _derived(argv: list[str], launch: compact.LaunchPlan) -> dict[int, dict[str, str]]:
    """Run the wrapper's arithmetic of every context for each of its ranks, in ``sh``."""
    derive = INSTANCE_WRAPPER[2].split('if [ "$_prL" = 10 ]', 1)[0]
    got: dict[int, dict[str, str]] = {}
    at = 0
    for context in launch.contexts:
        at = argv.index(INSTANCE_WRAPPER[2], at) + 1
        fields = argv[at + 1 : at + 5]
        ranks = " ".join(str(r) for r in range(context.first, context.first + context.instances))
        env = {**ENV, "RANKS": ranks, **compact.job_values(launch)}
        script = HARNESS.format(derive=derive)
        out = subprocess.run(
            ["/bin/sh", "-c", script, "poprun-instance", *fields, "prog", "a b"],
            env=env, capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        for block in out.split("rank ")[1:]:
            rank, *lines = block.splitlines()
            values = dict(line.split("=", 1) for line in lines if not line.startswith("argv "))
            values["argv"] = next(line for line in lines if line.startswith("argv "))[5:]
            got[int(rank)] = values
    return got


@pytest.mark.parametrize(("name", "config", "numa", "pool"), _cases(), ids=[c[0] for c in _cases()])
def test_the_wrapper_works_out_what_the_per_instance_rendering_gave(
    name: str,
    config: cfg.RunConfig,
    numa: dict[str, int] | None,
    pool: tuple[str, ...] | None,
) -> None:
    topology = plan(config, numa)
    argv = build_argv(
        config, topology, mpirun="mpirun", forwarded=[], is_root=False, local_cpus=2,
        numactl="/usr/bin/numactl", device_pool=pool,
    )  # fmt: skip
    launch = compact.plan_launch(config, topology, pool, "/usr/bin/numactl")
    got = _derived(argv, launch)
    assert sorted(got) == [p.index for p in topology.instances]
    for today in topology.instances:
        values = got[today.index]
        run = values.pop("argv")
        assert values == instance_values(config, today, pool), today
        nodes = ",".join(map(str, today.numa_nodes))
        bound = f"/usr/bin/numactl --cpunodebind={nodes} --membind={nodes} " if nodes else ""
        assert run == f"{bound}prog a b"


def test_an_instance_on_another_host_reports_how_it_ended(tmp_path: Path) -> None:
    """The wrapper's remote path, run here by hand: the pid line, the values, the program's
    own exit code, and the exit record with its end time as the last stderr line."""
    fields = ["0 0 1 0 0", "a:1,b:1", "o", ""]
    env = {**ENV, "OMPI_COMM_WORLD_RANK": "1", "POPDIST_NUM_INSTANCES": "2",
           "POPDIST_NUM_TOTAL_REPLICAS": "2", "POPDIST_NUM_IPUS_PER_REPLICA": "1"}  # fmt: skip
    program = ["/bin/sh", "-c", 'echo "$POPDIST_HOST $POPDIST_INSTANCE_INDEX"; exit 7']
    done = subprocess.run(
        [*INSTANCE_WRAPPER, *fields, *program], env=env, capture_output=True, timeout=30
    )
    assert done.returncode == 7
    assert done.stdout == b"b 1\n"
    lines = done.stderr.splitlines()
    assert lines[0].startswith(PID_MARKER) and lines[-1].startswith(EXIT_MARKER + b"7 ")
    assert len(lines) == 2


REMOTE_ENV = {
    **ENV, "OMPI_COMM_WORLD_RANK": "1", "POPDIST_NUM_INSTANCES": "2",
    "POPDIST_NUM_TOTAL_REPLICAS": "2", "POPDIST_NUM_IPUS_PER_REPLICA": "1",
}  # fmt: skip


def test_an_engines_node_only_variables_are_unset_on_another_host() -> None:
    """Grid Engine's ``qrsh -inherit -V`` carries mpirun's whole environment over: the
    remote wrapper unsets what describes poprun's host only (``POPRUN_UNSET``), and its own
    variables; the rest reaches the program."""
    env = {**REMOTE_ENV, "PE_HOSTFILE": "/var/spool/pe_hostfile", "JOB_ID": "31",
           "POPRUN_UNSET": "PE_HOSTFILE"}  # fmt: skip
    program = ["/bin/sh", "-c", "env | grep -E '^(PE_HOSTFILE|JOB_ID|POPRUN_|_pr)' | sort"]
    done = subprocess.run(
        [*INSTANCE_WRAPPER, "0 0 1 0 0", "a:1,b:1", "o", "", *program],
        env=env, capture_output=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"JOB_ID=31\n"


def test_on_another_host_the_program_dies_with_open_mpis_daemon(tmp_path: Path) -> None:
    """An Open MPI daemon killed outright (a scheduler's qdel SIGKILLs it) took neither the
    remote wrapper nor the program with it: both were left running. Started as mpirun
    starts them across hosts (``setpriv --pdeathsig KILL`` before the wrapper, its path in
    ``POPRUN_PDEATHSIG``), both end with the daemon, here a stand-in killed by SIGKILL."""
    setpriv = find_setpriv(os.environ)
    if setpriv is None:
        pytest.skip("util-linux's setpriv with --pdeathsig is not on PATH")
    pids = tmp_path / "pids"
    program = ["/bin/sh", "-c", f'echo "$$" >> {pids}; exec sleep 600']
    wrapper = [setpriv, "--pdeathsig", "KILL", *INSTANCE_WRAPPER, "0 0 1 0 0", "a:1,b:1", "o", ""]
    daemon = subprocess.Popen(  # the stand-in for orted: it starts the wrapper and waits
        [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()",
         *wrapper, *program],
        env={**REMOTE_ENV, "POPRUN_PDEATHSIG": setpriv}, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and pids.read_text().strip()):
            assert time.monotonic() < deadline and daemon.poll() is None
            time.sleep(0.02)
        child = int(pids.read_text())
        status = Path(f"/proc/{child}/status").read_text()
        assert "PPid:" in status
        daemon.kill()  # SIGKILL to the daemon alone, not to its process group
        daemon.wait()
        deadline = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < deadline, "the program outlived the daemon"
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, 9)
    assert_no_descendants()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _poprun(tmp_path: Path, instances: int, *program: str) -> tuple[subprocess.Popen[str], Gate]:
    gate = Gate(tmp_path)
    args = ["--num-instances", str(instances), "--num-replicas", str(2 * instances)]
    proc = subprocess.Popen(
        poprun_argv(*args, "/bin/sh", GATHERED, str(tmp_path), *program),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=job_env(), cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    return proc, gate


def _finish(proc: subprocess.Popen[str], gate: Gate, instances: int) -> tuple[str, str]:
    """Release the instances once all have started; the job's output."""
    outputs: list[str] = []
    reader = threading.Thread(target=lambda: outputs.extend(proc.communicate(timeout=120)))
    reader.start()
    try:
        started = gate.wait_started(instances, timeout=90)
        assert started is not None, f"{gate.count} of {instances} instances started"
        gate.release()
        reader.join(timeout=120)
    finally:
        gate.close()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        reader.join()
    return outputs[0], outputs[1]


N = 128


def test_128_light_instances_end_0_with_their_values(tmp_path: Path) -> None:
    proc, gate = _poprun(tmp_path, N)
    out, err = _finish(proc, gate, N)
    assert proc.returncode == 0, err[-2000:]
    rows = sorted(
        line.split()[1:] for line in out.splitlines() if line.split(":", 1)[-1].startswith("values")
    )  # [1,i]<stdout>:values ...
    seen = {int(row[0]): row for row in rows}
    assert sorted(seen) == list(range(N))
    for i, row in seen.items():
        devices = f"{2 * i},{2 * i + 1}"
        assert row == [str(i), str(i), str(N), "2", str(2 * i), "localhost", devices, str(i)]
    assert_no_descendants()


def test_one_of_128_failing_ends_the_job_with_its_code_and_names_it(tmp_path: Path) -> None:
    proc, gate = _poprun(tmp_path, N, "77", "3")
    _, err = _finish(proc, gate, N)
    assert proc.returncode == 3, err[-2000:]
    assert "poprun: instance 77 failed first: exit code 3 (host localhost" in err
    assert "instance 77 is failing on purpose" in err
    assert_no_descendants()


def _limited(soft: int, hard: int) -> None:  # in the child, before exec
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_poprun_raises_its_soft_file_limit_for_a_job_that_needs_it(tmp_path: Path) -> None:
    """128 instances on this host need about 3 descriptors each in poprun (two FIFOs and a
    pidfd) and as many in mpirun: over a soft limit of 256, under the hard one."""
    gate = Gate(tmp_path)
    proc = subprocess.Popen(
        poprun_argv("--num-instances", str(N), "--num-replicas", str(N), "/bin/sh", GATHERED,
                    str(tmp_path)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        env=job_env(), cwd=ROOT, start_new_session=True,
        preexec_fn=lambda: _limited(256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
    )  # fmt: skip
    _, err = _finish(proc, gate, N)
    assert proc.returncode == 0, err[-2000:]
    assert_no_descendants()


def test_a_hard_file_limit_too_small_is_one_line_and_nothing_launched(tmp_path: Path) -> None:
    done = subprocess.run(
        poprun_argv("--num-instances", str(N), "--num-replicas", str(N), "/bin/true"),
        capture_output=True, text=True, env=job_env(), cwd=ROOT, timeout=60,
        preexec_fn=lambda: _limited(256, 256),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("poprun: error: "), done.stderr
    assert "ulimit -Hn" in lines[0] and "256" in lines[0]
    assert_no_descendants()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
