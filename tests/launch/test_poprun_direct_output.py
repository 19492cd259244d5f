"""Instances on poprun's own host write to poprun through FIFOs, not through mpirun."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from types import SimpleNamespace
from typing import Any, cast

import pytest

from poprun.run.output.fifos import ENV, DirectOutput
from tests.support.jobs import run_poprun as poprun

pytestmark = pytest.mark.launch

#: Each instance reports what its stdout and stderr are, and whether it sees poprun's variable.
REPORT = f"""
import json, os, stat, sys
modes = {{fd: os.fstat(fd).st_mode for fd in (1, 2)}}
print(json.dumps({{
    "fifo": [stat.S_ISFIFO(m) for m in modes.values()],
    "paths": [os.readlink(f"/proc/self/fd/{{fd}}") for fd in (1, 2)],
    "env": {ENV!r} in os.environ,
}}))
print("to stderr", file=sys.stderr)
"""


def test_local_instances_write_to_poprun_fifos_that_are_removed_after() -> None:
    done = poprun("--num-replicas", "2", "--num-instances", "2", sys.executable, "-c", REPORT)
    assert done.returncode == 0, done.stderr
    reports = {
        int(line[3]): json.loads(line.split(":", 1)[1])  # "[1,<i>]<stdout>:{...}"
        for line in done.stdout.splitlines()
        if '"fifo"' in line
    }
    assert sorted(reports) == [0, 1], done.stdout
    for index, report in reports.items():
        assert report["fifo"] == [True, True]
        assert not report["env"]  # the wrapper took the variable out of the program's view
        stdout, stderr = report["paths"]
        assert stdout.endswith(f"/{index}.stdout") and stderr.endswith(f"/{index}.stderr")
        directory = os.path.dirname(stdout)
        assert os.path.basename(directory).startswith("poprun-output-")
        assert not os.path.exists(directory)  # removed when the job ended
    assert "[1,0]<stderr>:to stderr" in done.stderr and "[1,1]<stderr>:to stderr" in done.stderr


def test_a_flood_from_two_instances_arrives_whole_and_in_order() -> None:
    """8 MB per instance, every line numbered: nothing lost, duplicated or reordered."""
    writer = (
        "import sys\n"
        "i = sys.argv[1]\n"
        "sys.stdout.writelines(f'{i} {n} ' + 'x' * 80 + '\\n' for n in range(90_000))\n"
    )
    args = ("--num-replicas", "2", "--num-instances", "2")
    done = poprun(
        *args, "sh", "-c", f'exec {sys.executable} -c "$0" $POPDIST_INSTANCE_INDEX', writer
    )
    assert done.returncode == 0, done.stderr
    for index in (0, 1):
        prefix = f"[1,{index}]<stdout>:"
        lines = [
            line[len(prefix) :] for line in done.stdout.splitlines() if line.startswith(prefix)
        ]
        expected = [f"{index} {n} " + "x" * 80 for n in range(90_000)]
        assert (
            hashlib.sha256("\n".join(lines).encode()).hexdigest()
            == hashlib.sha256("\n".join(expected).encode()).hexdigest()
        ), f"instance {index}: {len(lines)} lines"


def test_a_fifo_no_instance_opened_reads_as_closed() -> None:
    """What the supervisor relies on when mpirun ends before an instance started."""
    seen: list[bytes] = []
    direct = DirectOutput([0], lambda instance, kind, data: seen.append(data))
    try:
        (fd_out, _), (fd_err, _) = direct.feeds.items()
        assert stat.S_ISFIFO(os.fstat(fd_out).st_mode)
        assert os.read(fd_err, 10) == b""  # no writer: end of file, not "would block"
        writer = os.open(os.path.join(direct.directory, "0.stdout"), os.O_WRONLY)
        with pytest.raises(BlockingIOError):  # a writer that has not written yet
            os.read(fd_out, 10)
        os.write(writer, b"abc")
        os.close(writer)
        assert os.read(fd_out, 10) == b"abc"
        assert os.read(fd_out, 10) == b""
    finally:
        direct.close()
    assert not os.path.exists(direct.directory) and not direct.feeds


def _one_local_instance() -> Any:
    from poprun.plan.topology import Topology

    return cast(Topology, SimpleNamespace(instances=[SimpleNamespace(index=0, host="localhost")]))


def test_a_started_launch_no_loop_watched_is_ended_and_leaves_nothing() -> None:
    """An error between the early start and the supervisor's loop (poprun.run.launch): the
    started process is ended and reaped, the FIFOs removed, job control put back."""
    import signal

    from poprun.run.launch import Launch
    from poprun.run.signals import SignalInbox

    before = signal.getsignal(signal.SIGTSTP)
    launch = Launch(_one_local_instance(), SignalInbox())
    assert os.path.isdir(launch.direct.directory) and signal.getsignal(signal.SIGTSTP) != before
    launch.start(["sleep", "30"], dict(os.environ))
    proc = launch.proc
    assert proc is not None and proc.poll() is None and launch.error is None
    launch.close()
    assert proc.returncode == -signal.SIGTERM  # ended by poprun, and reaped
    assert not os.path.exists(launch.direct.directory)
    assert signal.getsignal(signal.SIGTSTP) == before
    launch.close()  # a second close (the caller's, after the supervisor's) does nothing


def test_a_launch_that_cannot_start_keeps_the_error() -> None:
    from poprun.run.launch import Launch
    from poprun.run.signals import SignalInbox

    launch = Launch(_one_local_instance(), SignalInbox())
    try:
        launch.start(["/nonexistent/mpirun"], dict(os.environ))
        assert launch.proc is None and launch.tried and "nonexistent" in (launch.error or "")
    finally:
        launch.close()
