"""PopTorch's read accessors under a real poprun: each instance reads its own values back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.jobs import ROOT
from tests.support.jobs import run_poprun as poprun

pytestmark = pytest.mark.launch


def test_options_read_back_the_instances_values(tmp_path: Path) -> None:
    result = poprun(
        "--num-replicas",
        "4",
        "--num-instances",
        "2",
        sys.executable,
        str(ROOT / "tests" / "bin" / "poptorch_options_view.py"),
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    views = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    assert [v["distributed_process_id"] for v in views] == [0, 1]
    assert [v["launched_process_id"] for v in views] == [0, 1]
    for view in views:
        assert view["num_distributed_processes"] == view["launched_processes"] == 2
        assert view["launched_replication_factor"] == 2
        assert view["popart_options"] == {"autoRecomputation": 3}
        assert view["ops_identity"] is True
