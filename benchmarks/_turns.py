"""Jobs launched side by side that take turns: backends interleaved block by block.

Launched one after the other, two backends' jobs differ by more than the backends do. On a
shared 2-core VM the same 16 MB allreduce takes 10-20 % longer in one launch than in the next,
while inside one launch its blocks agree within a few percent (issue 33). So a per-launch
ratio of two backends is mostly the machine's drift between their launches.

Here every job starts at once, each in processes of its own with only its own threads, and a
coordinator hands out turns: one job times a block of calls while every other job's ranks
wait in a blocking read (no CPU). The order rotates every pass, so the blocks of two backends
that are compared lie next to each other, a second or so apart. The job's side is
``Turns`` in ``benchmarks/allreduce_worker.py``: a rank reads ``g`` from ``go.RANK`` to start
a turn, writes ``d`` to ``done`` when it ends, and once when it has started up.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any


@dataclass
class TurnJob:
    """One job's command (it gets ``--turns DIR`` appended), environment and directory."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    ranks: int
    proc: subprocess.Popen[bytes] | None = None
    out: IO[bytes] | None = None
    go: list[int] = field(default_factory=list)
    done: int = -1


def take_turns(
    jobs: Mapping[str, TurnJob], turns: int, *, timeout_s: float = 600
) -> dict[str, str]:
    """Run ``jobs`` side by side, each taking ``turns`` turns (then one more to report and
    exit, one job at a time); returns each job's output. A job that fails raises
    ``RuntimeError`` with its output; the others are ended."""
    work = Path(tempfile.mkdtemp(prefix="popdist-turns-"))
    deadline = time.monotonic() + timeout_s
    names = list(jobs)
    try:
        for i, name in enumerate(names):
            _start(jobs[name], work / str(i))
        for name in names:  # every rank started up before the first timed block
            _expect(name, jobs[name], jobs[name].ranks, deadline)
        for p in range(turns):
            for name in names[p % len(names) :] + names[: p % len(names)]:
                job = jobs[name]
                for fd in job.go:
                    os.write(fd, b"g")
                _expect(name, job, job.ranks, deadline)
        outputs = {}
        for name in names:  # the last turn: report and exit while the others wait
            job = jobs[name]
            assert job.proc is not None and job.out is not None
            for fd in job.go:
                os.write(fd, b"g")
            rc = job.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            job.out.seek(0)
            outputs[name] = job.out.read().decode(errors="replace")
            if rc:
                raise RuntimeError(f"{name} exited with {rc}: {outputs[name][-3000:]}")
        return outputs
    finally:
        for job in jobs.values():
            _end(job)
        shutil.rmtree(work, ignore_errors=True)


def worker_lines(out: str) -> list[dict[str, Any]]:
    """The JSON lines ``allreduce_worker.py`` printed (one a size), from a job's output."""
    return [json.loads(line[line.index("{") :]) for line in out.splitlines() if "{" in line]


def block_times(outputs: Mapping[str, str]) -> dict[str, dict[int, list[float]]]:
    """Each job's ``allreduce_worker.py`` lines read back: job -> size -> the slowest rank's
    median of each block, in turn order."""
    return {
        name: {r["bytes"]: r["blocks"] for r in worker_lines(out)} for name, out in outputs.items()
    }


def block_ratio(measured: Sequence[float], anchor: Sequence[float]) -> float:
    """Bandwidth measured / anchor over blocks timed next to each other (times, in turn
    order): the median of the pairs' ratios."""
    return statistics.median(a / m for m, a in zip(measured, anchor, strict=True))


def _start(job: TurnJob, directory: Path) -> None:
    directory.mkdir()
    for r in range(job.ranks):
        os.mkfifo(directory / f"go.{r}")
    os.mkfifo(directory / "done")
    # Read and write ends at once: neither this open nor the ranks' opens block.
    job.go = [os.open(directory / f"go.{r}", os.O_RDWR) for r in range(job.ranks)]
    job.done = os.open(directory / "done", os.O_RDWR)
    job.out = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _end)
    job.proc = subprocess.Popen(
        [*job.argv, "--turns", str(directory)],
        cwd=job.cwd,
        env=dict(job.env),
        stdout=job.out,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # ended by its process group if the run fails
    )


def _expect(name: str, job: TurnJob, count: int, deadline: float) -> None:
    """Wait for ``count`` bytes on the job's ``done`` FIFO (its ranks ended a turn)."""
    assert job.proc is not None and job.out is not None
    got = 0
    while got < count:
        ready, _, _ = select.select([job.done], [], [], 1.0)
        if ready:
            got += len(os.read(job.done, count - got))
            continue
        if job.proc.poll() is not None or time.monotonic() > deadline:
            job.out.seek(0)
            tail = job.out.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"{name} stopped taking turns (exit {job.proc.poll()}): {tail}")


def _end(job: TurnJob) -> None:
    if job.proc is not None and job.proc.poll() is None:
        os.killpg(job.proc.pid, signal.SIGTERM)  # poprun ends its instances
        try:
            job.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait()
    for fd in [*job.go, job.done]:
        if fd >= 0:
            os.close(fd)
    job.go, job.done = [], -1
    if job.out is not None:
        job.out.close()
        job.out = None
