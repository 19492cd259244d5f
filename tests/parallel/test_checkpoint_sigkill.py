"""A checkpoint save killed half-way leaves the previous checkpoint: a writer process is
SIGKILLed mid-save, so this lives in this tier, not in ``tests/unit``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from popdist_torch.checkpoint import read_checkpoint, save_checkpoint
from tests.support.data import net
from tests.support.jobs import ROOT

pytestmark = pytest.mark.parallel

WRITER = ROOT / "tests" / "bin" / "ckpt_writer.py"


def test_sigkill_during_a_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), str(path), str(4_000_000)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "saved 0"
        # The signal: the next save's temporary file exists and is being written.
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size > 0 for p in tmp_path.glob(".ckpt.pt.tmp-*") if p.exists()):
            assert time.monotonic() < deadline, "the writer never started a second save"
            time.sleep(0.001)  # polling interval of the file check, not a synchronisation
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        printed = [line.split()[1] for line in proc.stdout.read().splitlines()]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    last = int(printed[-1]) if printed else 0
    state = read_checkpoint(path)
    version = state["extra"]["version"]
    assert version in (last, last + 1)  # +1: that save completed before the kill landed
    assert state["step"] == version
    assert torch.equal(state["extra"]["blob"], torch.full((4_000_000,), float(version)))

    # the killed writer's temporary file is cleaned up by the next save
    save_checkpoint(path, model=net())
    assert not list(tmp_path.glob(".ckpt.pt.tmp-*"))
