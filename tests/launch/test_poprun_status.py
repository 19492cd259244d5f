"""Issue 27: the live status (``--status-port``, the summary signals) and the straggler table.

Real poprun → real mpirun → ``tests/bin/progress_train.py`` (popdist_torch training, so the
steps and the gradients' allreduces are the executor's own).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeVar

import pytest

from tests.support.jobs import ROOT, assert_no_descendants, start_poprun
from tests.support.jobs import run_poprun as poprun

pytestmark = pytest.mark.launch

TWO = ("--num-replicas", "2", "--num-instances", "2")
PROGRAM = str(ROOT / "tests" / "bin" / "progress_train.py")
#: Generous: the instances import torch on a loaded machine; nothing here is timed.
PATIENCE_S = 90.0
T = TypeVar("T")


class Lines:
    """A stream's lines, read on a thread, waited for with a deadline (never a bare sleep)."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait(self, wanted: Callable[[str], bool], what: str) -> str:
        """The next line ``wanted`` accepts (every line read is kept in :attr:`seen`)."""
        deadline = time.monotonic() + PATIENCE_S
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                pytest.fail(f"{what} never appeared on poprun's stderr:\n" + "\n".join(self.seen))
            self.seen.append(line)
            if wanted(line):
                return line

    def rest(self) -> list[str]:
        """Every line until the stream ends."""
        self._thread.join(PATIENCE_S)
        while (line := self._queue.get_nowait() if not self._queue.empty() else None) is not None:
            self.seen.append(line)
        return self.seen


def _get(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.headers["Content-Type"], answer.read().decode()


def _until(read: Callable[[], T], ok: Callable[[T], bool], what: str) -> T:
    """Read again until ``ok`` (the instances report about once a second); fail after a while."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        got = read()
        if ok(got):
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: last read {got!r}")
        time.sleep(0.2)  # poll a condition the job reaches by itself


def _series(text: str, name: str) -> dict[str, float]:
    """instance label → value of the metric ``name`` (Prometheus' own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        s.labels["instance"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def _finish(proc: subprocess.Popen[str]) -> int:
    try:
        return proc.wait(timeout=PATIENCE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail("poprun did not end")


def test_the_status_endpoint_and_the_summary_during_a_run(tmp_path: Path) -> None:
    hold = tmp_path / "go"
    proc = start_poprun(
        *TWO, "--status-port", "0", sys.executable, PROGRAM,
        "--steps", "6", "--hold-after", "3", "--hold-file", str(hold),
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        err = Lines(proc.stderr)
        line = err.wait(lambda s: s.startswith("poprun: status on "), "the endpoint's address")
        metrics_url, status_url = line.split()[3], line.split()[-1]
        assert metrics_url.startswith("http://127.0.0.1:") and metrics_url.endswith("/metrics")

        # Instance 0 holds after 3 steps; instance 1 waits for it in the 4th step's allreduce.
        def steps(text: str) -> dict[str, float]:
            return _series(text, "poprun_instance_steps_total")

        kind, text = _until(
            lambda: _get(metrics_url),
            lambda got: steps(got[1]) == {"0": 3.0, "1": 3.0},
            "both instances' 3 steps on /metrics",
        )
        assert kind.startswith("text/plain")
        for name in (
            "poprun_instance_collectives_total",
            "poprun_instance_reduced_bytes_total",
            "poprun_instance_collective_wait_seconds_total",
            "poprun_instance_resident_memory_bytes",
            "poprun_instance_last_progress_age_seconds",
            "poprun_instance_samples_per_second",
        ):
            assert set(_series(text, name)) == {"0", "1"}, name
        assert all(v > 0 for v in _series(text, "poprun_instance_resident_memory_bytes").values())
        assert 'host="' in text

        status = _until(
            lambda: json.loads(_get(status_url)[1]),
            lambda data: data["progress"][1:] and data["progress"][1]["pending"] is not None,
            "instance 1's pending collective on /status",
        )
        assert status["instances"] == 2
        assert [row["instance"] for row in status["progress"]] == [0, 1]
        assert status["progress"][0]["steps"] == 3 and status["progress"][1]["steps"] == 3

        # Ctrl-T style: SIGUSR1, then SIGUSR2, each prints the table; the job goes on.
        for signum in (signal.SIGUSR1, signal.SIGUSR2):
            os.kill(proc.pid, signum)
            err.wait(lambda s: s.startswith("poprun: status after "), f"the summary ({signum!r})")
            rows = [err.wait(lambda s, i=i: s.split()[1:2] == [str(i)], f"row {i}") for i in (0, 1)]
            assert all("localhost" in row and " ago" in row for row in rows), rows
            err.wait(lambda s: s.startswith("poprun: instance 1 is in collective #"), "pending")
        assert proc.poll() is None

        hold.touch()  # instance 0 goes on: the job ends
        assert _finish(proc) == 0, "\n".join(err.rest())
        lines = err.rest()
        assert any(s.startswith("poprun: progress of the 2 instances") for s in lines), lines
        with pytest.raises(urllib.error.URLError):  # the endpoint went with the job
            _get(metrics_url)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert_no_descendants()


def test_the_slow_instance_is_named_at_the_end() -> None:
    result = poprun(
        *TWO, sys.executable, PROGRAM, "--steps", "20", "--slow-instance", "1", "--slow-s", "0.3",
        timeout=PATIENCE_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    title = next(i for i, s in enumerate(lines) if s.startswith("poprun: progress of the 2"))
    header, first, second = lines[title + 1 : title + 4]
    assert header.split()[1:3] == ["instance", "host"]
    assert first.split()[1:3] == ["0", "localhost"] and second.split()[1:3] == ["1", "localhost"]
    named = [s for s in lines if "held the others up" in s]
    assert len(named) == 1 and named[0].startswith("poprun: instance 1 (localhost) held"), lines
    assert_no_descendants()


def test_one_instance_gets_no_table() -> None:
    result = poprun(sys.executable, PROGRAM, "--steps", "3", timeout=PATIENCE_S)
    assert result.returncode == 0, result.stderr
    assert "progress of the" not in result.stderr and "held the others up" not in result.stderr


def test_a_port_in_use_is_one_line_and_nothing_is_launched(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        marker = tmp_path / "ran"
        result = poprun("--status-port", str(port), "sh", "-c", f"touch {marker}")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"poprun: error: --status-port={port}: cannot listen on 127.0.0.1:{port} "
        "(Address already in use); fix: choose another port, or 0 for a free one"
    ]
    assert not marker.exists()
