"""popdist's excepthook in a real interpreter: an uncaught exception becomes one marked line.

Each test starts a Python process (so it is not in the unit tier); no mpirun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from popdist import error_record

pytestmark = pytest.mark.parallel

SCRIPT = """
import sys
def mine(kind, exc, tb):
    print("previous hook ran:", kind.__name__, file=sys.stderr)
sys.excepthook = mine
import popdist
raise ZeroDivisionError("no replicas")
"""


def _run(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("POPDIST_")}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env={**clean, **env},
        check=False,
    )


def test_asked_for_records_writes_one_line_then_chains_the_previous_hook() -> None:
    done = _run(POPDIST_ERROR_RECORD="1", POPDIST_INSTANCE_INDEX="2", POPDIST_HOST="node7")
    assert done.returncode == 1
    first, second = done.stderr.splitlines()[:2]
    assert first.startswith(error_record.MARKER)
    fields = json.loads(first[len(error_record.MARKER) :])
    assert list(fields) == list(error_record.FIELDS)
    assert (fields["instance"], fields["host"], fields["type"], fields["message"]) == (
        2,
        "node7",
        "ZeroDivisionError",
        "no replicas",
    )
    assert fields["pid"] > 0
    assert fields["traceback"].endswith("line 7, in <module>\nZeroDivisionError: no replicas\n")
    assert second == "previous hook ran: ZeroDivisionError"


def test_not_asked_no_record() -> None:
    done = _run()
    assert done.returncode == 1
    assert done.stderr == "previous hook ran: ZeroDivisionError\n"
