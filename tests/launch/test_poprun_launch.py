"""Real poprun → real mpirun → tiny scripts in tests/bin. No process may survive a test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, assert_no_descendants, wait_for_line
from tests.support.jobs import run_poprun as poprun
from tests.support.jobs import start_poprun as start

pytestmark = pytest.mark.launch

BIN = ROOT / "tests" / "bin"
PY = sys.executable


def test_popdist_view_of_eight_replicas_on_four_instances(tmp_path: Path) -> None:
    awkward = ["it's", 'say "hi"', "two  spaces", "$HOME", ""]
    result = poprun(
        "--num-replicas",
        "8",
        "--num-instances",
        "4",
        "--ipus-per-replica",
        "2",
        "--backend",
        "torch",
        PY,
        str(BIN / "popdist_view.py"),
        str(tmp_path),
        *awkward,
        env={"SENTINEL": "a 'quoted' \"value\" with spaces"},
    )
    assert result.returncode == 0, result.stderr
    views = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(4)]
    assert [v["replica_index_offset"] for v in views] == [0, 2, 4, 6]
    assert {v["num_local_replicas"] for v in views} == {2}
    assert {v["num_total_replicas"] for v in views} == {8}
    assert {v["num_ipus_per_replica"] for v in views} == {2}
    assert [v["instance_index"] for v in views] == [0, 1, 2, 3]
    assert [v["local_instance_index"] for v in views] == [0, 1, 2, 3]
    for view in views:
        assert view["argv"] == awkward
        assert view["env"]["SENTINEL"] == "a 'quoted' \"value\" with spaces"
        assert view["env"]["PYTHONUNBUFFERED"] == "1"
        assert view["env"]["POPDIST_BACKEND"] == "torch"
        assert view["from_poprun"] is True


def _allocator_figures(
    script: str, key: str, default_allocator: bool, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[int, str]]:
    """Run ``script`` as 2 instances from an environment without malloc settings (with
    ``--use-default-allocator`` or not): each instance's integer after ``key``, and its line."""
    for name in [n for n in os.environ if n.startswith("MALLOC_")] + ["GLIBC_TUNABLES"]:
        monkeypatch.delenv(name, raising=False)
    option = ["--use-default-allocator"] if default_allocator else []
    result = poprun(*option, "--num-instances", "2", "--num-replicas", "2", PY, str(BIN / script))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if key in line]
    assert len(lines) == 2, result.stdout
    return [(int(line.split(key)[1].split()[0]), line) for line in lines]


@pytest.mark.parametrize("default_allocator", [False, True])
def test_instances_keep_freed_memory_instead_of_faulting_it_in_again(
    default_allocator: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = _allocator_figures(
        "allocator_faults.py", "faults_per_step=", default_allocator, monkeypatch
    )
    for faults, line in figures:
        if default_allocator:  # glibc trims the freed 16 MiB and faults it in again: ~4000
            assert faults > 1000 and "trim=-" in line, line
        else:
            assert faults < 100 and "trim=1073741824" in line, line


@pytest.mark.parametrize("default_allocator", [False, True])
def test_instances_get_huge_pages_for_their_heap(
    default_allocator: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    mode = thp.read_text().split("[")[1].split("]")[0] if thp.exists() else "never"
    if mode == "never":
        pytest.skip("the kernel's transparent huge pages are off")
    figures = _allocator_figures("huge_pages.py", "huge_kb=", default_allocator, monkeypatch)
    for huge_kb, line in figures:
        if not default_allocator:  # at least half of the 16 MiB on 2 MB pages
            assert huge_kb >= 8 << 10 and "glibc.malloc.hugetlb=1" in line, line
        elif mode == "madvise":  # only what a program asks for gets them
            assert huge_kb == 0 and "tunables=-" in line, line


@pytest.mark.parametrize("own_choice", [False, True])
def test_a_large_allreduce_does_not_fault_its_buffer_in_on_every_call(
    own_choice: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("OMPI_MCA_coll")]:
        monkeypatch.delenv(name, raising=False)
    # A coll* parameter of the user's own: poprun leaves Open MPI's allreduce choice alone.
    env = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "0"} if own_choice else {}
    # On 4 KB pages (a mapping on 2 MB pages takes 512 times fewer faults) with poprun's
    # thresholds: glibc's hugetlb tunable alone leaves the rest of the defaults in place.
    env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=0"
    script = str(BIN / "allreduce_faults.py")
    result = poprun("--num-instances", "2", "--num-replicas", "2", PY, script, env=env)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "faults_per_allreduce=" in line]
    assert len(lines) == 2 and all("sum=128" in line for line in lines), result.stdout
    for line in lines:
        faults = int(line.split("faults_per_allreduce=")[1].split()[0])
        if own_choice:  # the 16 MiB it writes of a temporary buffer mapped afresh: ~4000
            assert faults > 1000, line
        else:
            assert faults < 100, line


def test_output_prefixes_partial_lines_cr_and_split_utf8(tmp_path: Path) -> None:
    result = poprun(
        "--num-replicas", "2", "--num-instances", "2", PY, str(BIN / "awkward_output.py")
    )
    assert result.returncode == 0, result.stderr
    for i in (0, 1):
        tag = f"[1,{i}]<stdout>:"
        assert f"{tag}start {i} continued\n" in result.stdout
        assert f"{tag}progress 10%\r" in result.stdout and f"{tag}progress 100%\r" in result.stdout
        assert f"{tag}❄ from {i}\n" in result.stdout
        assert f"{tag}last {i}\n" in result.stdout  # no trailing newline in the source
        assert f"[1,{i}]<stderr>:to stderr {i}\n" in result.stderr
    assert "poprun-pid" not in result.stderr


def test_only_output_from_one_instance_while_output_dir_holds_all(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    result = poprun(
        "--num-replicas",
        "2",
        "--num-instances",
        "2",
        "--only-output-from-instance",
        "1",
        "--output-dir",
        str(out),
        PY,
        str(BIN / "awkward_output.py"),
    )
    assert result.returncode == 0, result.stderr
    assert "[1,1]<stdout>:last 1" in result.stdout and "[1,0]" not in result.stdout
    assert "[1,0]" not in result.stderr
    for i in (0, 1):
        assert (out / f"instance-{i}.stdout").read_text().endswith(f"❄ from {i}\nlast {i}")
        assert (out / f"instance-{i}.stderr").read_text() == f"to stderr {i}\n"
        mode = (out / f"instance-{i}.stdout").stat().st_mode
        assert not mode & 0o002, "log files must never be world-writable"


@pytest.mark.parametrize(("how", "code"), [("3", 3), ("kill", 137)])
def test_one_failing_instance_ends_the_job_with_its_code(how: str, code: int) -> None:
    # The others sleep 60 s: the job must be ended for them (poprun's timeout fails the test).
    result = poprun(
        "--num-replicas",
        "3",
        "--num-instances",
        "3",
        str(BIN / "fail_one.sh"),
        "1",
        how,
        timeout=30,
    )
    assert result.returncode == code, result.stderr
    assert "poprun: instance 1 failed first" in result.stderr
    assert "host localhost, pid " in result.stderr
    assert "    instance 1 is failing on purpose" in result.stderr
    assert "Primary job" not in result.stderr  # mpirun's box became poprun's report
    assert_no_descendants()


def test_an_instance_reports_its_own_exception_as_a_record(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    result = poprun(
        "--num-replicas",
        "2",
        "--num-instances",
        "2",
        "--output-dir",
        str(out),
        PY,
        str(BIN / "raise_one.py"),
        "1",
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    first = lines.index(next(line for line in lines if "failed first" in line))
    assert lines[first].startswith("poprun: instance 1 failed first: exit code 1 (host ")
    assert lines[first + 1] == "poprun: instance 1 raised ValueError: bad shard on instance 1"
    assert "    ValueError: bad shard on instance 1" in lines[first + 2 :]
    # The record is data: neither on the console nor in the instance's file; the normal
    # traceback still printed.
    assert "popdist-error" not in result.stderr + result.stdout
    saved = (out / "instance-1.stderr").read_text()
    assert "\x1f" not in saved and saved.startswith("about to fail\nTraceback")
    assert "[1,1]<stderr>:ValueError: bad shard on instance 1" in result.stderr
    assert_no_descendants()


def test_python_exception_in_a_horovod_collective_ends_the_job() -> None:
    pytest.importorskip("horovod.torch", reason="needs Horovod (built by the set-up)")
    result = poprun(
        "--num-replicas", "2", "--num-instances", "2", PY, str(BIN / "horovod_fail.py"), timeout=120
    )
    assert result.returncode == 1, result.stderr
    assert "poprun: instance 1 failed first: exit code 1" in result.stderr
    assert (
        "poprun: instance 1 raised RuntimeError: instance 1 fails inside the training step"
        in result.stderr
    )
    assert_no_descendants()


def test_timeout_ends_a_hung_job_and_names_the_running_instances() -> None:
    result = poprun(
        "--num-replicas",
        "3",
        "--num-instances",
        "3",
        "--timeout",
        "1.5",
        str(BIN / "hang_after_exit0.sh"),
    )
    assert result.returncode == 124, result.stderr
    line = next(line for line in result.stderr.splitlines() if "instances still running" in line)
    assert "1 (host localhost" in line and "2 (host localhost" in line and " 0 (" not in line
    assert_no_descendants()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_are_forwarded(sig: signal.Signals, code: int) -> None:
    proc = start(
        "--num-replicas", "2", "--num-instances", "2", "-vv", "sh", "-c", "echo up; exec sleep 60"
    )
    assert proc.stdout is not None and proc.stderr is not None
    wait_for_line(proc.stdout, "up", 2)
    proc.send_signal(sig)
    # How fast it ends is measured in benchmarks/launch_overhead.py ("Ctrl-C to exit").
    assert proc.wait(timeout=30) == code
    proc.stdout.close()
    proc.stderr.close()
    assert_no_descendants(within=3.0)


def test_instances_do_not_outlive_a_sigkilled_poprun() -> None:
    proc = start(
        "--num-replicas", "2", "--num-instances", "2", "sh", "-c", "echo up; exec sleep 60"
    )
    assert proc.stdout is not None and proc.stderr is not None
    wait_for_line(proc.stdout, "up", 2)
    proc.kill()
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    assert_no_descendants(within=4.0)


def test_ctrl_c_on_one_job_leaves_the_other_running(tmp_path: Path) -> None:
    # The survivor's instances cannot finish before the test lets them (each reads a line
    # from its own FIFO), so however slowly either job starts, the survivor is still running
    # when the victim gets Ctrl-C.
    go = tmp_path / "go"
    for i in (0, 1):
        os.mkfifo(f"{go}.{i}")
    victim = start(
        "--num-replicas", "2", "--num-instances", "2", "sh", "-c", "echo up; exec sleep 60"
    )
    survivor = start(
        "--num-replicas",
        "2",
        "--num-instances",
        "2",
        "--output-dir",
        str(tmp_path / "b"),
        "sh",
        "-c",
        'echo up; read line < "$0.$POPDIST_INSTANCE_INDEX"; echo "done $line"',
        str(go),
    )
    assert victim.stdout is not None and survivor.stdout is not None
    wait_for_line(victim.stdout, "up", 2)
    wait_for_line(survivor.stdout, "up", 2)
    victim.send_signal(signal.SIGINT)
    assert victim.wait(timeout=10) == 130
    assert survivor.poll() is None
    # O_RDWR never blocks on a FIFO: the line waits there for the instance to read it.
    fds = [os.open(f"{go}.{i}", os.O_RDWR | os.O_NONBLOCK) for i in (0, 1)]
    try:
        for fd in fds:
            os.write(fd, b"go\n")
        out, err = survivor.communicate(timeout=30)
    finally:
        for fd in fds:
            os.close(fd)
    assert survivor.returncode == 0, err
    assert out.count("done go") == 2
    assert victim.stdout is not None and victim.stderr is not None
    victim.stdout.close()
    victim.stderr.close()
    assert_no_descendants()


def test_soak_fifty_launches_leave_nothing_behind(tmp_path: Path) -> None:
    """50 back-to-back launches of `true`: no process, session file or segment left."""
    # Open MPI's session directory and shared-memory segments go to tmp_path (not the
    # /dev/shm other jobs on this host share), which must be empty afterwards.
    env = {"TMPDIR": str(tmp_path), "OMPI_MCA_btl_vader_backing_directory": str(tmp_path)}
    for _ in range(50):
        result = poprun("--num-replicas", "2", "--num-instances", "2", "true", env=env)
        assert result.returncode == 0, result.stderr
    assert_no_descendants()
    assert list(tmp_path.iterdir()) == []


def _assert_main_imports_none_of(args: list[str], packages: tuple[str, ...]) -> None:
    """``poprun.cli.main(args)`` in a fresh interpreter returns 0 having imported no module of
    ``packages`` (top-level names)."""
    code = (
        f"import sys; from poprun.cli import main; rc = main({args!r}); "
        f"loaded = [m for m in sys.modules if m.split('.')[0] in {packages!r}]; "
        "assert rc == 0 and not loaded, loaded"
    )
    subprocess.run([PY, "-c", code], check=True, capture_output=True, cwd=ROOT)


def test_poprun_never_imports_torch_or_horovod() -> None:
    args = ["--num-replicas", "2", "--num-instances", "2", "--dry-run=yes", "true"]
    _assert_main_imports_none_of(args, ("torch", "horovod"))


def test_a_launch_never_imports_dataclasses() -> None:
    """poprun's records are NamedTuples and its mutable state plain classes: ``dataclasses``
    (with the ``inspect`` it imports) and each dataclass's generated methods took about
    25 ms of a launch on a slow CPU (issue 33). A whole launch, to the end of its summary."""
    args = ["--num-replicas", "2", "--num-instances", "2", "true"]
    _assert_main_imports_none_of(args, ("dataclasses", "inspect"))
    assert_no_descendants()


def test_a_time_out_of_a_year_runs_the_job() -> None:
    """Past epoll's 24.8 days the supervisor waits in steps; the job runs as usual."""
    result = poprun("--num-replicas", "2", "--num-instances", "2", "--timeout", "31536000", "true")
    assert result.returncode == 0, result.stderr
    assert_no_descendants()
