"""popdist: the PopDist API on Open MPI and Horovod.

What a training script launched by ``poprun`` imports: the getters that place this
instance in the run (:mod:`popdist.context`), the collective backend (:func:`init`, whose
backends and life cycle are :mod:`popdist.collectives`), and
:func:`execute_on_instances`. The sharding arithmetic is :mod:`popdist.sharding`;
``popdist.poptorch.Options`` is PopTorch's options set up from the launch.

Under poprun, importing ``popdist`` also installs an excepthook that reports an uncaught
exception to poprun as a structured record (:mod:`popdist.error_record`), and starts the
reporter of the instance's progress (:mod:`popdist.progress`).

The time-limit notice (:mod:`popdist.deadline`): :func:`should_stop` tells every instance,
at the same step, that the job should save a checkpoint and stop.

Importing ``popdist`` is cheap and stdlib-only: torch and Horovod are imported by the calls
that need them (:func:`init`, :func:`execute_on_instances`, ``popdist.poptorch``).
"""

from __future__ import annotations

from popdist import sharding
from popdist.collectives import finalize as finalizeBackend
from popdist.collectives import init
from popdist.collectives import is_initialized as isBackendInitialized
from popdist.context import (
    checkNumIpusPerReplica,
    getDeviceId,
    getInstanceIndex,
    getLocalInstanceIndex,
    getNumInstances,
    getNumIpusPerReplica,
    getNumLocalReplicas,
    getNumTotalReplicas,
    getReplicaIndexOffset,
    isPopdistEnvSet,
)
from popdist.deadline import install_if_asked as _install_notice
from popdist.deadline import notice_received, should_stop
from popdist.env import PopdistError
from popdist.error_record import install_if_asked as _install_error_record
from popdist.instances import execute_on_instances
from popdist.lease import start_if_asked as _hold_lease
from popdist.progress import start_if_asked as _start_progress

#: PopDist's other name for :func:`init`.
initializeBackend = init

_install_error_record()  # under poprun: an uncaught exception is also reported as data
_start_progress()  # under poprun: collectives and steps are counted and reported
_install_notice()  # under poprun: the time-limit notice (SIGUSR1) sets a flag, nothing else
_hold_lease()  # under poprun across hosts: cut off from poprun, the instance ends itself

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from typing import Any

    from popdist import poptorch

__all__ = [
    "PopdistError",
    "checkNumIpusPerReplica",
    "execute_on_instances",
    "finalizeBackend",
    "getDeviceId",
    "getInstanceIndex",
    "getLocalInstanceIndex",
    "getNumInstances",
    "getNumIpusPerReplica",
    "getNumLocalReplicas",
    "getNumTotalReplicas",
    "getReplicaIndexOffset",
    "init",
    "initializeBackend",
    "isBackendInitialized",
    "isPopdistEnvSet",
    "notice_received",
    "poptorch",
    "sharding",
    "should_stop",
]


def __getattr__(name: str) -> Any:
    """``popdist.poptorch`` on first use, so ``import popdist`` does not import torch."""
    if name == "poptorch":
        import importlib

        return importlib.import_module("popdist.poptorch")
    raise AttributeError(f"module 'popdist' has no attribute {name!r}")
