"""popdist under real launches: poprun 4 instances × 8 replicas, and single processes.

The launches and the start-up checks run on both collective backends; the single-process
life-cycle tests are Horovod's (MPI's one initialisation, its thread's timer slack).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from popdist import env as contract
from tests.support.jobs import ROOT, job_env, run_job

pytestmark = pytest.mark.parallel

CHILD = ROOT / "tests" / "bin" / "popdist_instance.py"


@pytest.fixture
def _needs_backend() -> None:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    pytest.importorskip("horovod.torch", reason="Horovod is built by `make setup`")


@pytest.mark.timeout(240)
def test_poprun_4_instances_8_replicas(backend: str, tmp_path: Path) -> None:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    argv = [sys.executable, "-m", "poprun", "--num-instances", "4", "--num-replicas", "8"]
    argv += ["--backend", backend]
    argv += ["--ipus-per-replica", "2", sys.executable, str(CHILD), str(tmp_path)]
    result = run_job(argv, timeout=200)
    assert result.returncode == 0, result.stdout[-4000:]

    reports = {i: json.loads((tmp_path / f"instance-{i}.json").read_text()) for i in range(4)}
    for i, got in reports.items():
        assert {k: got[k] for k in list(got)[:10]} == {
            "isPopdistEnvSet": True,
            "getNumTotalReplicas": 8,
            "getNumLocalReplicas": 2,
            "getNumIpusPerReplica": 2,
            "getReplicaIndexOffset": 2 * i,
            "getInstanceIndex": i,
            "getNumInstances": 4,
            "getLocalInstanceIndex": i,  # all four on this host
            "getDeviceId": 24 + i,  # 4-device groups of a 16-device system
            "checkNumIpusPerReplica(2)": True,
        }, f"instance {i}"
        assert got["torch_before_init"] is False
        # init() froze the heap that torch's and the backend's imports built (popdist.heap)
        assert got["frozen_before_init"] == 0 and got["frozen_after_init"] > 50_000
        assert got["initialized"] is True
        assert got["collectives"] == [backend, 4, i]
        assert got["horovod_imported"] is (backend == "horovod")
        assert got["grouped_mean"] == [1.5, 3.0]
        assert got["execute_0"] == ("first from 0" if i == 0 else None)
        assert got["execute_13"] == (f"second from {i}" if i in (1, 3) else None)
        if i in (1, 2):
            assert got["failure"] == ["ValueError", f"deliberate failure on {i}"]
        else:
            assert got["failure"] == [
                "PopdistError",
                "execute_on_instances: fail failed on instance(s) [1, 2]; see their error "
                "output for the cause",
            ]
        assert got["after_failure_sum"] == 4.0
        assert got["initialized_after_finalize"] is False
    markers = sorted(p.name for p in tmp_path.iterdir() if "-ran-on-" in p.name)
    assert markers == ["first-ran-on-0", "second-ran-on-1", "second-ran-on-3"]


SINGLE = """
import popdist
popdist.init()
import horovod.torch as hvd
print("size", hvd.size(), "rank", hvd.rank(), "init", popdist.isBackendInitialized())
print("execute", popdist.execute_on_instances({0}, lambda: 42))
popdist.finalizeBackend()
print("after", popdist.isBackendInitialized())
try:
    popdist.init()
except popdist.PopdistError as exc:
    print("again", exc)
"""

EXIT_HOOK = """
import atexit, popdist

def after_finalize():  # registered before init(), so it runs after popdist's finaliser
    import horovod.torch as hvd
    print("at exit initialized", hvd.is_initialized(), popdist.isBackendInitialized())

atexit.register(after_finalize)
popdist.init()
print("started", popdist.isBackendInitialized())
"""


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("_needs_backend")
def test_init_in_a_single_process_without_poprun() -> None:
    result = run_job([sys.executable, "-c", SINGLE], timeout=100)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = [
        line
        for line in result.stdout.splitlines()
        if line.split(" ")[0] in {"size", "execute", "after", "again", "at"}
    ]
    assert lines == [
        "size 1 rank 0 init True",
        "execute 42",
        "after False",
        "again popdist.init() after popdist.finalizeBackend(): the backend cannot be started "
        "twice in one process (MPI allows one initialisation); call finalizeBackend() only "
        "when the script is done with collectives",
    ]


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("_needs_backend")
def test_backend_is_finalised_at_exit() -> None:
    result = run_job([sys.executable, "-c", EXIT_HOOK], timeout=100)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.split(" ")[0] in {"started", "at"}]
    assert lines == ["started True", "at exit initialized False False"]


@pytest.mark.timeout(120)
def test_init_rejects_a_run_the_backend_does_not_see(backend: str) -> None:
    """A process carrying instance 1 of 4's variables but started alone: a clear error."""
    environ = job_env(POPDIST_BACKEND=backend)
    environ.update(
        contract.instance_environment(
            num_total_replicas=8,
            num_ipus_per_replica=1,
            num_instances=4,
            instance_index=1,
            local_instance_index=1,
            num_local_instances=4,
            host="localhost",
        )
    )
    code = "import popdist\ntry:\n    popdist.init()\nexcept popdist.PopdistError as e:\n    print('ERR', e)\nprint('init', popdist.isBackendInitialized())"
    result = run_job([sys.executable, "-c", code], env=environ, timeout=100)
    assert result.returncode == 0, result.stdout[-3000:]
    who = "Horovod" if backend == "horovod" else "MPI"
    assert (
        f"ERR {who} sees rank 0 of 1 processes but poprun's POPDIST_* says instance 1 of 4: "
        "start every instance from one poprun (or mpirun) command and do not mix launchers"
    ) in result.stdout
    assert "init False" in result.stdout


SLACK = """
import json
import os
import popdist

def slack(tid):
    with open(f"/proc/{tid}/timerslack_ns") as f:
        return int(f.read())

main = os.getpid()
before_tids = set(os.listdir("/proc/self/task"))
before = slack(main)
popdist.init()
started = sorted(set(os.listdir("/proc/self/task")) - before_tids)
print("main", before, slack(main))
print("started", json.dumps([slack(t) for t in started]))
"""


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("_needs_backend")
def test_init_gives_horovods_thread_a_fine_timer_slack_and_restores_the_callers() -> None:
    result = run_job([sys.executable, "-c", SLACK], timeout=100)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    before, after = map(int, lines["main"].split())
    assert after == before > 1000  # the caller's slack is back
    started = json.loads(lines["started"])
    assert 1000 in started, started  # Horovod's background thread (and MPI's) inherit 1 us
