"""examples/mnist_pipeline.py: trains to a useful accuracy, both strategies agree, profile files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_pipeline.py"


def load_example() -> ModuleType:
    pytest.importorskip("sklearn")
    spec = importlib.util.spec_from_file_location("mnist_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
def test_default_run_reaches_90_percent_and_writes_a_profile(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    example = load_example()
    accuracy = example.main(["--profile", "--profile-dir", str(tmp_path)])
    assert accuracy >= 90.0
    trace = json.loads((tmp_path / "schedule.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["tid"] for e in spans} == {0, 1}
    assert {e["cat"] for e in spans} == {"forward", "backward"}
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(180)
def test_pipelined_and_sharded_train_the_same_model() -> None:
    example = load_example()
    common = ["--epochs", "2", "--offload-optimiser"]
    pipelined = example.main([*common, "--strategy", "pipelined"])
    sharded = example.main([*common, "--strategy", "sharded"])
    assert pipelined == sharded
