"""A tier that needs what the machine may lack (root, namespaces, Slurm): skipped with the
reason where it cannot run, but failed under ``CI=true`` where it must, so CI never skips it
silently."""

from __future__ import annotations

import pytest


def require(tier: str, reason: str | None, must_run: bool) -> None:
    """Return if ``reason`` is None (the tier can run); else skip the test, or fail it when
    ``must_run``."""
    if reason is None:
        return
    if must_run:
        pytest.fail(f"the {tier} tier must run under CI=true, but {reason}")
    pytest.skip(f"{tier} tier: {reason}")
