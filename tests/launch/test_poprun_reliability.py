"""Issue 18: no hang, no orphan, no traceback. Real poprun → real mpirun → tiny scripts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.jobs import ROOT, assert_no_descendants, poprun_argv, wait_for_line
from tests.support.jobs import run_poprun as poprun
from tests.support.jobs import start_poprun as start

pytestmark = pytest.mark.launch

TWO = ("--num-replicas", "2", "--num-instances", "2")


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """The rest of ``proc``'s output; on time-out its session is killed and the test fails."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"poprun outlived {timeout} s:\n{out[-2000:]}\n{err[-2000:]}")


def _state(pid: int) -> str:
    """The process state letter of ``pid`` ("" if it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_a_child_holding_the_output_open_does_not_hang_the_job() -> None:
    # The instances exit 0 at once; each leaves a sleeper holding its stdout (bare mpirun
    # would wait for it forever).
    proc = start(*TWO, "sh", "-c", "sleep 300 & echo bg $!")
    out, err = _finish(proc, timeout=40)
    assert proc.returncode == 0, err
    left = [int(line.split()[-1]) for line in out.splitlines() if ":bg " in line]
    assert len(left) == 2, out
    assert "left behind" in err and all(str(pid) in err for pid in left), err
    assert all(_state(pid) in ("", "Z") for pid in left)
    assert_no_descendants()


@pytest.mark.parametrize("how", ["background", "setsid"])
def test_grandchildren_do_not_survive_the_job(how: str) -> None:
    launch = "setsid sleep 300" if how == "setsid" else "sleep 300"
    result = poprun(*TWO, "sh", "-c", f"{launch} </dev/null >/dev/null 2>&1 & echo bg $!")
    assert result.returncode == 0, result.stderr
    left = [int(line.split()[-1]) for line in result.stdout.splitlines() if "bg " in line]
    assert len(left) == 2, result.stdout
    assert "left behind" in result.stderr
    assert_no_descendants()


def test_a_closed_reader_ends_output_quietly_and_the_job_runs_on(tmp_path: Path) -> None:
    marker = tmp_path / "finished"
    script = f"for i in $(seq 2000); do echo line $i; done; sleep 0.5; touch {marker}.$POPDIST_INSTANCE_INDEX"
    proc = subprocess.Popen(
        [*poprun_argv(), *TWO, "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"[1,")  # like `| head -1`
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert marker.with_suffix(".0").exists() and marker.with_suffix(".1").exists()
    assert_no_descendants()


@pytest.mark.parametrize("closed", ["stdout", "stderr", "both"])
def test_a_closed_standard_stream_at_start_is_not_an_error(closed: str, tmp_path: Path) -> None:
    redirect = {"stdout": ">&-", "stderr": "2>&-", "both": ">&- 2>&-"}[closed]
    cmd = " ".join(
        [*poprun_argv(), *TWO, "--output-dir", str(tmp_path / "out"), "sh", "-c", "'echo hi'"]
    )
    shell = subprocess.run(
        ["sh", "-c", f"{cmd} {redirect}; echo rc=$?"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert shell.stdout.strip().endswith("rc=0"), (shell.stdout, shell.stderr)
    assert "Traceback" not in shell.stderr and "Error" not in shell.stderr, shell.stderr
    for i in range(2):  # the job ran: its output still reached the files
        assert (tmp_path / "out" / f"instance-{i}.stdout").read_text() == "hi\n"
    assert_no_descendants()


def test_ctrl_z_suspends_the_instances_and_fg_resumes_them(tmp_path: Path) -> None:
    # No fork in the loop: a shell stopped while it vforks `sleep` shows "D", not "T".
    script = (
        "import os, time\n"
        "print('pid', os.getpid(), flush=True)\n"
        "for _ in range(200):\n"
        "    time.sleep(0.05)\n"
        "print('done', flush=True)\n"
    )
    proc = start(*TWO, sys.executable, "-c", script)
    assert proc.stdout is not None and proc.stderr is not None
    pids = []
    for line in proc.stdout:
        if "pid " in line:
            pids.append(int(line.split()[-1]))
            if len(pids) == 2:
                break
    proc.send_signal(signal.SIGTSTP)
    deadline = time.monotonic() + 10
    while not all(_state(pid) == "T" for pid in [proc.pid, *pids]):
        assert time.monotonic() < deadline, [_state(p) for p in [proc.pid, *pids]]
        time.sleep(0.02)  # polling /proc for the state, not a synchronisation
    time.sleep(0.3)  # stopped for a while: the instances make no progress meanwhile
    assert all(_state(pid) == "T" for pid in pids)
    proc.send_signal(signal.SIGCONT)
    out, err = _finish(proc, timeout=40)
    assert proc.returncode == 0, err
    assert out.count("done") == 2
    assert_no_descendants()


def test_a_double_ctrl_c_exits_130_and_leaves_nothing_behind(tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path), "OMPI_MCA_btl_vader_backing_directory": str(tmp_path)}
    for _ in range(4):  # it used to end by SIGINT about one time in four
        proc = start(*TWO, sys.executable, "-c", "print('up', flush=True); import time; time.sleep(60)",
                     env=env)  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        wait_for_line(proc.stdout, "up", 2)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)  # a person pressing twice; mpirun is ending the job meanwhile
        proc.send_signal(signal.SIGINT)
        _, err = _finish(proc, timeout=30)
        assert proc.returncode == 130, err
        assert "Traceback" not in err, err
        assert_no_descendants()
        assert list(tmp_path.iterdir()) == [], "Open MPI's session files were left behind"


def test_a_killed_mpirun_is_reported(tmp_path: Path) -> None:
    proc = start(*TWO, "-vv", "sh", "-c", "echo up; exec sleep 60")
    assert proc.stdout is not None and proc.stderr is not None
    wait_for_line(proc.stdout, "up", 2)
    mpirun = [
        int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    ]
    assert len(mpirun) == 1
    os.kill(mpirun[0], signal.SIGKILL)
    _, err = _finish(proc, timeout=30)
    assert proc.returncode == 137, err
    assert "mpirun" in err and "SIGKILL" in err, err
    assert_no_descendants()


def test_an_instance_exiting_2_is_told_apart_from_a_usage_error() -> None:
    result = poprun(*TWO, "sh", "-c", '[ "$POPDIST_INSTANCE_INDEX" = 1 ] && exit 2; exec sleep 60')
    assert result.returncode == 2
    assert "poprun: instance 1 failed first: exit code 2" in result.stderr, result.stderr
    assert "poprun: error:" not in result.stderr
    assert_no_descendants()


def _handlers_installed(pid: int) -> bool:
    """Whether ``pid`` catches SIGTERM: poprun's handlers are in (Python's own catch only SIGINT)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(
        next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt")), 16
    )
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("run", range(5))
def test_two_ctrl_c_20_ms_apart_right_after_start_exit_130(run: int) -> None:
    """Two SIGINTs 20 ms apart, from the moment poprun's handlers are in (its first act), in
    whatever it is doing then (imports, planning, launching): exit code 130, never death by
    SIGINT. Before that moment the interpreter itself is starting, and no program in Python
    can answer a signal (measured: a SIGINT in the first ~20 ms kills any Python process)."""
    proc = start(*TWO, sys.executable, "-c", "import time; time.sleep(60)")
    deadline = time.monotonic() + 30
    while not _handlers_installed(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, "poprun never started"
        time.sleep(0.0005)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = _finish(proc, timeout=30)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert_no_descendants()


def test_main_in_process_puts_the_callers_signal_handlers_back() -> None:
    """``poprun.cli.main`` as a library: a real job, then this process's handlers as before."""
    code = (
        "import signal, sys\n"
        "from poprun.cli import main\n"
        "mine = lambda signum, frame: None\n"
        "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP):\n"
        "    signal.signal(sig, mine)\n"
        "wake = signal.set_wakeup_fd(-1)\n"
        "before = {sig: signal.getsignal(sig) for sig in signal.valid_signals()}\n"
        "rc = main(['--num-replicas', '2', '--num-instances', '2', 'true'])\n"
        "rc2 = main(['--num-replicas', '3', '--num-instances', '2', 'true'])\n"
        "after = {sig: signal.getsignal(sig) for sig in signal.valid_signals()}\n"
        "changed = [s for s in before if before[s] is not after[s]]\n"
        "assert (rc, rc2) == (0, 2) and not changed, (rc, rc2, changed)\n"
        "assert signal.set_wakeup_fd(-1) == -1\n"
        "print('same')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0 and done.stdout.endswith("same\n"), done.stderr
    assert_no_descendants()


def test_a_ctrl_c_as_poprun_exits_cannot_kill_it_by_sigint(tmp_path: Path) -> None:
    """Once the command's ``main`` has its exit code, SIGINT/SIGTERM/SIGHUP are blocked
    until the process ends (``os._exit``, its output flushed): a second Ctrl-C landing then,
    with the default handler back, used to kill poprun by SIGINT instead of letting it exit
    with the job's code. Played here: the default handler back, then SIGINT, just before
    the exit; nothing after ``main()`` runs."""
    script = (
        "import os, signal, sys\n"
        "from poprun import cli\n"
        "real_exit = cli._exit\n"
        "def late_ctrl_c(code):\n"
        "    signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    print('exiting', code, flush=True)\n"
        "    real_exit(code)\n"
        "cli._exit = late_ctrl_c\n"
        "sys.argv = ['poprun', '--version']\n"
        "cli.main()\n"
        "print('main returned', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.startswith("poprun ") and "exiting 0" in done.stdout
    assert "main returned" not in done.stdout
