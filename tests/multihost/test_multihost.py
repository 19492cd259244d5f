"""Real poprun across namespace hosts h1-h3 over ssh: placement, environment, training,
output, time-out, signals, failures. Every job starts on h1; after each test no process of
the job may be left on any host (``clean_hosts``).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.multihost.hosts import DOWN, Hosts
from tests.support.jobs import ROOT, job_env, poprun_argv, run_job

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

BIN = ROOT / "tests" / "bin"
PY = sys.executable


def poprun_on(
    hosts: Hosts, *args: str, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """``poprun ARGS`` started on h1, run to its end (stdout and stderr merged)."""
    argv = hosts.on("h1", poprun_argv(*args), cwd=str(ROOT))
    return run_job(argv, env=hosts.env(job_env(**env)), timeout=timeout)


def start_on(hosts: Hosts, *args: str, **env: str) -> subprocess.Popen[str]:
    """``poprun ARGS`` started on h1 in its own session; stdout and stderr merged."""
    return subprocess.Popen(
        hosts.on("h1", poprun_argv(*args), cwd=str(ROOT)),
        env=hosts.env(job_env(**env)),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A private directory with a short path, for ``TMPDIR``: the ssh masters' sockets in it
    must fit a Unix socket's 108 bytes, which a pytest ``tmp_path`` does not leave room for."""
    path = Path(tempfile.mkdtemp(prefix="mh-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def views(directory: Path) -> list[dict[str, object]]:
    files = sorted(directory.glob("*.json"), key=lambda p: int(p.stem))
    return [json.loads(p.read_text()) for p in files]


def test_getters_and_local_indices_per_host(clean_hosts: Hosts, tmp_path: Path) -> None:
    done = poprun_on(
        clean_hosts,
        "--num-instances", "6", "--num-replicas", "12", "-H", "h1,h2,h3",
        PY, str(BIN / "where.py"), str(tmp_path), "POPDIST_NUM_LOCAL_INSTANCES",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    seen = views(tmp_path)
    assert [(v["host"], v["instance"], v["local_instance"], v["offset"]) for v in seen] == [
        ("h1", 0, 0, 0),
        ("h1", 1, 1, 2),
        ("h2", 2, 0, 4),
        ("h2", 3, 1, 6),
        ("h3", 4, 0, 8),
        ("h3", 5, 1, 10),
    ]
    for v in seen:
        assert (v["instances"], v["replicas"], v["local_replicas"]) == (6, 12, 2)
        assert v["env"] == {"POPDIST_NUM_LOCAL_INSTANCES": "2"}


def test_every_instance_gets_the_environment(clean_hosts: Hosts, tmp_path: Path) -> None:
    """The user's variables, poprun's malloc settings and the cache path reach remote hosts."""
    names = ["MY_SETTING", "MALLOC_MMAP_THRESHOLD_", "POPDIST_EXECUTABLE_CACHE_PATH", "PYTHONPATH"]
    done = poprun_on(
        clean_hosts,
        "--num-instances", "4", "--num-replicas", "4", "-H", "h1,h2",
        "--executable-cache-path", str(tmp_path / "cache"),
        PY, str(BIN / "where.py"), str(tmp_path), *names,
        MY_SETTING="two words 'quoted'",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    seen = views(tmp_path)
    assert [v["host"] for v in seen] == ["h1", "h1", "h2", "h2"]
    for v in seen:
        assert v["env"] == {
            "MY_SETTING": "two words 'quoted'",
            "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
            "POPDIST_EXECUTABLE_CACHE_PATH": str(tmp_path / "cache"),
            "PYTHONPATH": str(ROOT),
        }, v


def test_host_file_and_ranges(clean_hosts: Hosts, tmp_path: Path) -> None:
    host_file = tmp_path / "hosts.txt"
    host_file.write_text("# the namespace hosts\nh[1-2]\n\nh3  # the last one\n")
    done = poprun_on(
        clean_hosts,
        "--num-instances", "3", "--num-replicas", "3", "--host-file", str(host_file),
        PY, str(BIN / "where.py"), str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert [v["host"] for v in views(tmp_path)] == ["h1", "h2", "h3"]
    ranged = tmp_path / "ranged"
    ranged.mkdir()
    done = poprun_on(
        clean_hosts,
        "--num-instances", "2", "--num-replicas", "2", "-H", "h[2-3]",
        PY, str(BIN / "where.py"), str(ranged),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert [v["host"] for v in views(ranged)] == ["h2", "h3"]


def test_horovod_training_ends_at_the_same_weights_as_on_one_host(
    clean_hosts: Hosts, tmp_path: Path
) -> None:
    from tests.support.topology import MODELS, OPTIMIZERS, reference

    runs = {"one host": [], "two hosts": ["-H", "h1,h2"]}
    for name, hosts_args in runs.items():
        out = tmp_path / name.replace(" ", "-")
        out.mkdir()
        done = poprun_on(
            clean_hosts,
            "--num-instances", "2", "--num-replicas", "4", *hosts_args,
            PY, str(BIN / "executor_topology.py"), str(out), "2",
        )  # fmt: skip
        assert done.returncode == 0, f"{name}:\n{done.stdout}"
    for model in MODELS:
        for opt in OPTIMIZERS:
            expected = reference(model, opt)
            one = torch.load(tmp_path / "one-host" / f"{model}.{opt}.0.pt")
            for rank in range(2):
                got = torch.load(tmp_path / "two-hosts" / f"{model}.{opt}.{rank}.pt")
                for key, value in expected.items():
                    torch.testing.assert_close(got[key], one[key], rtol=1e-6, atol=1e-7)
                    torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6)


def test_tagged_output_only_one_instance_and_log_files(clean_hosts: Hosts, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    script = 'echo "out from $(hostname)"; echo "err from $(hostname)" >&2'
    done = poprun_on(
        clean_hosts,
        "--num-instances", "4", "--num-replicas", "4", "-H", "h1,h2",
        "--output-dir", str(logs), "--only-output-from-instance", "3",
        "/bin/sh", "-c", script,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    shown = [line for line in done.stdout.splitlines() if " from " in line]
    assert sorted(shown) == ["[1,3]<stderr>:err from h2", "[1,3]<stdout>:out from h2"]
    for index, host in enumerate(["h1", "h1", "h2", "h2"]):
        out = sorted(p.name for p in logs.iterdir() if f"{index}" in p.name)
        assert len(out) == 2, sorted(p.name for p in logs.iterdir())
        texts = {p.read_text() for p in logs.iterdir() if p.name in out}
        assert texts == {f"out from {host}\n", f"err from {host}\n"}


def test_time_out_ends_the_job_on_every_host(clean_hosts: Hosts) -> None:
    done = poprun_on(
        clean_hosts,
        "--num-instances", "4", "--num-replicas", "4", "-H", "h1,h2", "--timeout", "4",
        "/bin/sh", "-c", 'echo "up on $(hostname)"; exec sleep 600',
    )  # fmt: skip
    assert done.returncode == 124, done.stdout
    assert done.stdout.count("up on h2") == 2
    assert "--timeout=4 s expired" in done.stdout


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_poprun_leaves_nothing_on_any_host(
    clean_hosts: Hosts, signum: int, short_tmp: Path
) -> None:
    # poprun's private directories go in $TMPDIR: a directory of this test's own, which no
    # other job (another test beside this one) writes in
    private = short_tmp
    before = set(private.glob("poprun-*-*"))
    proc = start_on(
        clean_hosts,
        "--num-instances", "4", "--num-replicas", "4", "-H", "h1,h2",
        "/bin/sh", "-c", 'echo "up on $(hostname)"; exec sleep 600',
        TMPDIR=str(private),
    )  # fmt: skip
    assert proc.stdout is not None
    up = 0
    for line in proc.stdout:
        up += "up on " in line
        if up == 4:
            break
    assert up == 4
    # The programs themselves (their wrappers there name them in their argv), once each shell
    # that printed its line has exec'd its sleep
    deadline = time.monotonic() + 10.0
    while True:
        remote = clean_hosts.leftovers().get("h2", [])
        if sum(p.endswith(": sleep 600") for p in remote) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sum(p.endswith(": sleep 600") for p in remote) == 2, remote
    proc.send_signal(signum)
    rest, _ = proc.communicate(timeout=60)
    if signum != signal.SIGKILL:
        assert proc.returncode == 128 + signum, rest
        assert f"received {signal.Signals(signum).name}" in rest
    left = clean_hosts.wait_clean(within=10.0)
    assert left == {}, left
    stale = set(private.glob("poprun-*-*")) - before
    if signum == signal.SIGKILL:  # its FIFOs' and ssh masters' directories: the next poprun's
        assert stale, "a SIGKILLed poprun left no directory: the check below checks nothing"
        done = run_job(
            poprun_argv("--num-instances", "1", "--num-replicas", "1", "true"),
            env=job_env(TMPDIR=str(private)),
        )
        assert done.returncode == 0, done.stdout
        stale = {path for path in stale if path.exists()}
    assert stale == set()


@pytest.mark.parametrize(
    "script", ["horovod_fail.py"] * 3 + ["popdist_fail.py"] * 2, ids=lambda s: s.split(".")[0]
)
def test_a_remote_crash_is_reported_with_its_traceback_and_exit_code(
    clean_hosts: Hosts, script: str
) -> None:
    """Instance 1, on h2, raises; instance 0, here, then fails in Horovod. Repeated: the
    report must name instance 1 every time (with or without error records)."""
    done = poprun_on(
        clean_hosts,
        "--num-instances", "2", "--num-replicas", "2", "-H", "h1,h2",
        PY, str(BIN / script),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "poprun: instance 1 failed first: exit code 1 (host h2, pid " in done.stdout
    report = done.stdout[done.stdout.index("poprun: instance 1 failed first") :]
    assert "RuntimeError: instance 1 fails inside the training step" in report
    if script == "popdist_fail.py":  # the record: its traceback, not the stderr tail
        assert "poprun: instance 1 raised RuntimeError: instance 1 fails inside" in report
    else:
        assert "Traceback (most recent call last):" in report
    assert report.splitlines()[-1].endswith("exit code 1")


def test_a_remote_error_record_names_host_and_pid(clean_hosts: Hosts) -> None:
    done = poprun_on(
        clean_hosts,
        "--num-instances", "4", "--num-replicas", "4", "-H", "h1,h2",
        PY, str(BIN / "raise_one.py"), "3",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    lines = done.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if "failed first" in line)
    assert lines[first].startswith("poprun: instance 3 failed first: exit code 1 (host h2, pid ")
    assert lines[first + 1] == "poprun: instance 3 raised ValueError: bad shard on instance 3"


@pytest.mark.parametrize("run", range(3))
def test_a_remote_exit_code_is_poprun_exit_code(clean_hosts: Hosts, run: int) -> None:
    """Repeated: once every instance has started, mpirun names the failing one every time."""
    done = poprun_on(
        clean_hosts,
        "--num-instances", "4", "--num-replicas", "4", "-H", "h1,h2",
        PY, str(BIN / "exit_after_init.py"), "3", "7",
    )  # fmt: skip
    assert done.returncode == 7, done.stdout
    assert done.stdout.count(" started") == 4
    assert "poprun: instance 3 failed first: exit code 7 (host h2, pid " in done.stdout


@pytest.mark.parametrize("run", range(6))
def test_a_remote_exit_at_start_is_named_with_its_code(clean_hosts: Hosts, run: int) -> None:
    """Failing right at the start, mpirun leaves out its "Process name: ... Exit code" box
    about one run in four; the instance's wrapper reports its exit status on its stderr
    (``REMOTE_WRAPPER``), so the root-cause line names it every time. Repeated."""
    done = poprun_on(
        clean_hosts,
        "--num-instances", "4", "--num-replicas", "4", "-H", "h1,h2",
        "/bin/sh", str(BIN / "fail_one.sh"), "3", "7",
    )  # fmt: skip
    assert done.returncode == 7, done.stdout
    assert "instance 3 is failing on purpose" in done.stdout
    assert "poprun: instance 3 failed first: exit code 7 (host h2, pid " in done.stdout, done.stdout
    assert "poprun-exit" not in done.stdout  # the status line is data, never shown
    report = done.stdout[done.stdout.index("poprun: instance 3 failed first") :]
    assert "    instance 3 is failing on purpose" in report  # its stderr tail, the line's not


@pytest.mark.parametrize("run", range(2))
def test_a_remote_instance_killed_by_a_signal_is_named(clean_hosts: Hosts, run: int) -> None:
    """The wrapper re-raises the program's signal: mpirun and poprun see the same ending."""
    done = poprun_on(
        clean_hosts,
        "--num-instances", "4", "--num-replicas", "4", "-H", "h1,h2",
        "/bin/sh", str(BIN / "fail_one.sh"), "2", "kill",
    )  # fmt: skip
    assert done.returncode == 137, done.stdout
    assert "poprun: instance 2 failed first: killed by signal 9 (SIGKILL) (host h2" in done.stdout


@pytest.mark.parametrize("wait", ["0", "2"])
def test_an_unreachable_host_is_named_in_one_line(
    clean_hosts: Hosts, tmp_path: Path, wait: str
) -> None:
    """Refused: tried again each second for --ssh-wait (one line says so), then one line
    naming the host; nothing launched."""
    done = poprun_on(
        clean_hosts,
        "--num-instances", "2", "--num-replicas", "2", "-H", f"h2,{DOWN}", "--ssh-wait", wait,
        "/bin/sh", "-c", f"touch {tmp_path / 'ran'}",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout
    lines = done.stdout.strip().splitlines()
    if wait != "0":
        waiting = lines.pop(0)
        assert waiting.startswith(f"poprun: waiting for 1 host(s) to answer ssh ({DOWN}: ")
        assert waiting.endswith(f"trying again for up to {wait} s (--ssh-wait)")
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"poprun: error: --host={DOWN}: cannot be reached by ssh")
    assert "Connection refused" in lines[0]
    assert (f"(tried for {wait} s, --ssh-wait)" in lines[0]) is (wait != "0")
    assert not (tmp_path / "ran").exists()


def test_the_launch_host_by_address_is_local(clean_hosts: Hosts, tmp_path: Path) -> None:
    """h1 as 10.77.0.11 is this host: its program is checked here, and instances run."""
    address = clean_hosts.addresses["h1"]
    done = poprun_on(
        clean_hosts,
        "--num-instances", "2", "--num-replicas", "2", "-H", f"{address},h2",
        "no-such-program-here",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout
    assert "no-such-program-here" in done.stdout and "not found" in done.stdout
    done = poprun_on(
        clean_hosts,
        "--num-instances", "2", "--num-replicas", "2", "-H", f"{address},h2",
        PY, str(BIN / "where.py"), str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert [v["host"] for v in views(tmp_path)] == ["h1", "h2"]


def test_mpirun_starts_its_daemons_over_the_checks_connections(clean_hosts: Hosts) -> None:
    """The ssh check's connections stay open as masters for Open MPI's agent, then close."""
    probe = (
        'if [ "$POPDIST_INSTANCE_INDEX" = 0 ]; then '
        "$OMPI_MCA_plm_rsh_agent -O check h2 && echo MASTER=$OMPI_MCA_plm_rsh_agent; fi"
    )
    done = poprun_on(
        clean_hosts, "--num-instances", "2", "--num-replicas", "2", "-H", "h1,h2",
        "/bin/sh", "-c", probe,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    assert "Master running" in done.stdout, done.stdout
    agent = next(line for line in done.stdout.splitlines() if "MASTER=" in line)
    directory = agent.split("ControlPath=", 1)[1].rsplit("/", 1)[0]
    assert not Path(directory).exists()  # the masters were stopped and their sockets removed
    skipped = poprun_on(
        clean_hosts, "--num-instances", "2", "--num-replicas", "2", "-H", "h1,h2",
        "--ssh-check", "no", "/bin/sh", "-c", probe,
    )  # fmt: skip
    assert "MASTER=" not in skipped.stdout  # no check, no masters: Open MPI's own ssh
