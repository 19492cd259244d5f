"""Sharding that must not depend on the interpreter: checked in separate processes."""

from __future__ import annotations

import pytest

from popdist.sharding import epoch_permutation

pytestmark = pytest.mark.parallel


def test_epoch_permutation_is_independent_of_hash_seed() -> None:
    import subprocess
    import sys

    code = "from popdist.sharding import epoch_permutation as e; print(e(20, 3, 1))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": h, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
            cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]),
        ).stdout
        for h in ("0", "1", "12345")
    }
    assert outs == {f"{epoch_permutation(20, 3, 1)}\n"}
