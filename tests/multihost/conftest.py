"""The multi-host tier: real poprun across namespace hosts with sshd (``hosts.py``).

One set of three hosts for the whole session (about 1.5 s to make). Where they cannot be
made (not root, no ``ip netns``, no sshd) the tier is skipped with the reason; under
``CI=true`` on a root machine with ``ip`` it fails instead, so CI never skips it silently.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.multihost.hosts import Hosts, unavailable
from tests.support.tiers import require

NUM_HOSTS = 3


def _must_run() -> bool:
    return os.environ.get("CI") == "true" and os.geteuid() == 0 and shutil.which("ip") is not None


@pytest.fixture(scope="session")
def hosts() -> Iterator[Hosts]:
    """Three namespace hosts h1, h2, h3; jobs start on h1 (``hosts.on("h1", argv)``)."""
    require("multi-host", unavailable(), _must_run())
    made = Hosts(NUM_HOSTS)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def clean_hosts(hosts: Hosts) -> Iterator[Hosts]:
    """The hosts; after the test, no process of the job may be left on any of them."""
    yield hosts
    left = hosts.wait_clean(within=10.0)
    if left:
        hosts.close_jobs()
        pytest.fail(f"processes left on the hosts: {left}")
