"""The Lightning IPU page's listings (seed documents), run as a user runs them.

Each script under this folder is a listing as written, with only its imports changed
(``lightning.pytorch``, ``popdist_torch as poptorch``, ``IPUStrategy`` from
``popdist_lightning``) and what the listing leaves to the reader (``MyLightningModule``,
the ``...`` of a class body) taken from ``listing_support``. A listing that does not run
fails here; nothing is skipped.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.jobs import job_env

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]
HERE = Path(__file__).resolve().parent
SAMPLES = 640  # listing_support.SAMPLES

# (script, device iterations, replicas): one Lightning step is one call of
# micro-batch 1 × device iterations × 8 replicas.
LISTINGS = [
    ("listing_1_device_iterations.py", 32),
    ("listing_2_options.py", 32),
    ("listing_3_begin_block.py", 20),
    ("listing_4_block_context.py", 20),
]


@pytest.mark.parametrize(("script", "device_iterations"), LISTINGS)
def test_listing_runs_as_written(script: str, device_iterations: int, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(HERE / script)],
        cwd=tmp_path,  # Lightning writes its logs and checkpoints here
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    report = re.search(r"seed listing: (.*)", output)
    assert report is not None, output[-4000:]
    fields = dict(item.split("=") for item in report.group(1).split())
    assert fields["strategy"] == "IPUStrategy"
    assert fields["replicas"] == "8"
    assert fields["weights_moved"] == "True"
    # one epoch (listing_support stops there): one step per combined batch
    assert int(fields["global_step"]) == SAMPLES // (device_iterations * 8)
