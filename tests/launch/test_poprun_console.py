"""poprun's own streams and leftovers, in a fresh interpreter as poprun uses them (processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.jobs import ROOT

pytestmark = pytest.mark.launch


CHILD = """
import sys
from poprun.run.output import console
console.install()
for i in range(20000):
    print("line", i)
print("still here", file=sys.stderr)
sys.stderr.flush()
"""


def test_install_survives_a_closed_reader_and_closed_fds() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait() == 0, err
    assert err == "still here\n"
    closed = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c \'{CHILD}\' >&- 2>&-; echo rc=$?'],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert closed.stdout == "rc=0\n", closed


LEFTOVERS = """
import os, subprocess, time
from poprun.run import leftovers
assert leftovers.become_subreaper()
others = set(leftovers.children(os.getpid()))  # never touch what was here before
# A shell that starts a sleeper and exits: the sleeper is re-parented here (its output
# goes elsewhere, or run() would wait for it to close the pipe).
shell = subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True)
orphan = int(shell.stdout)
deadline = time.monotonic() + 5
while orphan not in leftovers.children(os.getpid()):
    assert time.monotonic() < deadline, "the orphan never re-parented here"
    time.sleep(0.01)
assert orphan in leftovers.left_behind(keep=others), "not found"
assert "(sleep)" in leftovers.describe([orphan]), leftovers.describe([orphan])
assert orphan in leftovers.kill_and_reap(keep=others), "not killed"
assert not os.path.exists(f"/proc/{orphan}"), "not reaped"
print("ok")
"""


def test_leftovers_are_found_killed_and_reaped() -> None:
    # In a fresh interpreter, as poprun uses it: this pytest process may have children of
    # its own from earlier tests (an MPI singleton's orted), which are not the point here.
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", LEFTOVERS], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
