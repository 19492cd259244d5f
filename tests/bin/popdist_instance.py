"""One instance of the popdist acceptance run: getters, init, collectives, execute_on_instances.

Usage: popdist_instance.py OUT_DIR. Writes OUT_DIR/instance-<index>.json with what this
instance saw; the test compares the files of all instances.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import popdist

out = Path(sys.argv[1])
report: dict[str, object] = {
    name: getattr(popdist, name)()
    for name in (
        "isPopdistEnvSet",
        "getNumTotalReplicas",
        "getNumLocalReplicas",
        "getNumIpusPerReplica",
        "getReplicaIndexOffset",
        "getInstanceIndex",
        "getNumInstances",
        "getLocalInstanceIndex",
        "getDeviceId",
    )
}
report["checkNumIpusPerReplica(2)"] = popdist.checkNumIpusPerReplica(2)
report["torch_before_init"] = "torch" in sys.modules
index = popdist.getInstanceIndex()

report["frozen_before_init"] = gc.get_freeze_count()
popdist.init()
popdist.init()  # a second call does nothing
report["frozen_after_init"] = gc.get_freeze_count()  # the backend's imports (popdist.heap)
report["initialized"] = popdist.isBackendInitialized()

import torch  # noqa: E402 - after init, as a PopDist script does

import popdist.collectives  # noqa: E402

collectives = popdist.collectives.for_run()
report["collectives"] = [collectives.name, collectives.size(), collectives.rank()]
report["horovod_imported"] = "horovod" in sys.modules
mean = collectives.allreduce_(torch.tensor(float(index)), average=True)
doubled = collectives.allreduce_(torch.tensor(2.0 * index), average=True)
report["grouped_mean"] = [mean.item(), doubled.item()]


def write_marker(tag: str) -> str:
    (out / f"{tag}-ran-on-{index}").write_text("")
    return f"{tag} from {index}"


report["execute_0"] = popdist.execute_on_instances({0}, write_marker, "first")
report["execute_13"] = popdist.execute_on_instances({1, 3}, write_marker, "second")


def fail() -> None:
    raise ValueError(f"deliberate failure on {index}")


try:
    popdist.execute_on_instances({1, 2}, fail)
    report["failure"] = None
except Exception as exc:  # recorded: the test checks what every instance got
    report["failure"] = [type(exc).__name__, str(exc)]

# The collectives are still aligned after a failure inside execute_on_instances.
report["after_failure_sum"] = collectives.allreduce_(torch.tensor(1.0)).item()

popdist.finalizeBackend()
report["initialized_after_finalize"] = popdist.isBackendInitialized()
(out / f"instance-{index}.json").write_text(json.dumps(report))
