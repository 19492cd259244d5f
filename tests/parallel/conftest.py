"""The parallel tier runs on both collective backends: the ``backend`` fixture.

Every test that takes ``backend`` runs once with Horovod and once with torch.distributed
(gloo here; NCCL on a GPU machine), with the same assertions: the backends must give the
same results. Horovod's runs are skipped where Horovod is not built (``make setup``).
"""

from __future__ import annotations

import importlib.util

import pytest

BACKENDS = ("horovod", "torch")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """``horovod`` or ``torch``: pass it to ``poprun --backend`` or ``run_mpi(backend=)``."""
    name: str = request.param
    if name == "horovod" and importlib.util.find_spec("horovod") is None:
        pytest.skip("Horovod is built by `make setup`")
    return name
