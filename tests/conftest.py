"""Suite-wide guards: a test must not leak POPDIST_*/OMPI_* changes or child processes.

The pytest process makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a
process a test started in its own session, and orphaned since, is re-parented here and is
still seen as a descendant when the test ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import (
    HARNESS_DAEMONS,
    become_subreaper,
    cmdline,
    descendants,
    reap_children,
)

ROOT = Path(__file__).resolve().parent.parent
GUARDED_PREFIXES = ("POPDIST_", "OMPI_", "PMIX_", "HOROVOD_")
SURVIVOR_GRACE_S = 5.0


def pytest_configure(config: pytest.Config) -> None:
    become_subreaper()
    config.addinivalue_line(
        "markers",
        "gridengine: real poprun inside jobs of a Grid Engine cell on namespace hosts (root)",
    )


TIERS = ("unit", "launch", "parallel", "lightning", "multihost", "slurm", "gridengine", "packaging")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under ``CI=true`` a test skipped for want of Horovod fails: CI must have built it."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI", "").lower() != "true" or not report.skipped:
        return
    if "horovod" in str(report.longrepr).lower() and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"CI=true and Horovod is missing: {report.longrepr}"


#: Tests that share one costly fixture run on one pytest-xdist worker, one after another
#: (``make test`` runs two workers), so it is made once and never used by two tests at once.
XDIST_GROUPS = {
    # first: the simulated clusters' pods, and h1-h3 of their own, beside the rest of the tier
    "tests/multihost/test_clusters.py": "clusters",
    "tests/multihost/": "multihost",  # one set of namespace hosts; one elastic reference run
    "tests/slurm/": "slurm",  # one Slurm cluster
    "tests/gridengine/": "gridengine",  # one Grid Engine cell on its own namespace hosts
    "tests/packaging/": "packaging",  # one wheel, one fresh virtual environment
    "tests/parallel/test_replica_split.py": "replica_split",  # one single-instance reference
}


def xdist_group(nodeid: str) -> str | None:
    """The group of ``XDIST_GROUPS`` the test ``nodeid`` belongs to, if any."""
    path = nodeid.split("::", 1)[0]
    return next((g for prefix, g in XDIST_GROUPS.items() if path.startswith(prefix)), None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier (its directory), so `-m unit` selects a tier."""
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


if importlib.util.find_spec("xdist") is not None:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's load scheduling, with each group of ``XDIST_GROUPS`` one unit of work.

        (xdist's own ``--dist loadgroup`` marks a group by rewriting the test's node id, which
        pytest 9 no longer lets a plugin do: there every test would be scheduled alone.)"""

        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> GroupScheduling:
        return GroupScheduling(config, log)


@pytest.fixture(autouse=True)
def _no_environment_leak() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if k.startswith(GUARDED_PREFIXES)}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith(GUARDED_PREFIXES)}
    if after != before:
        changed = sorted(set(before.items()) ^ set(after.items()))
        for key in {k for k, _ in changed}:
            if key in before:
                os.environ[key] = before[key]
            else:
                os.environ.pop(key, None)
        pytest.fail(f"test leaked environment changes: {changed}")


@pytest.fixture(autouse=True)
def _no_surviving_children(request: pytest.FixtureRequest) -> Iterator[None]:
    known = set(descendants())
    yield
    deadline = time.monotonic() + SURVIVOR_GRACE_S
    while True:
        reap_children()
        # the harness's own daemons (an sshd a test restarted) are not leftovers; what runs
        # under them is
        survivors = [p for p in descendants() if p not in known and p not in HARNESS_DAEMONS]
        if not survivors or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if survivors:
        described = [f"{p}: {cmdline(p)}" for p in survivors]
        for pid in survivors:  # by pid only: never a broad name
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reap_children()
        pytest.fail(f"test left child processes running: {described}")


#: The collective backends: a test that takes the ``backend`` fixture runs on each, with the
#: same assertions (the parallel tier, the launch tier's checkpoint test, Lightning's).
BACKENDS = ("horovod", "torch")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """``horovod`` or ``torch``: pass it to ``poprun --backend`` or ``run_mpi(backend=)``.

    Horovod's runs are skipped where Horovod is not built (``make setup``); torch's use gloo
    here and NCCL on a GPU machine.
    """
    name: str = request.param
    if name == "horovod" and importlib.util.find_spec("horovod") is None:
        pytest.skip("Horovod is built by `make setup`")
    return name
