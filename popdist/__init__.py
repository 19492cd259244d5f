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

import os

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
from popdist.env import ERROR_RECORD, LEASE, NUM_INSTANCES, PROGRESS, PopdistError
from popdist.instances import execute_on_instances

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from typing import Any

    from popdist import poptorch, sharding
    from popdist.collectives import finalize as finalizeBackend
    from popdist.collectives import init
    from popdist.collectives import is_initialized as isBackendInitialized
    from popdist.deadline import notice_received, should_stop

    initializeBackend = init

#: The names imported on first use (:func:`__getattr__`): name -> (module, its attribute, or
#: None for the module itself). ``import popdist`` outside poprun then imports neither
#: threading, signal nor functools (issue 33: with no editable-install hook importing them
#: first, they were 2/3 of the import).
_LAZY = {
    "sharding": ("popdist.sharding", None),
    "poptorch": ("popdist.poptorch", None),  # so that ``import popdist`` does not import torch
    "init": ("popdist.collectives", "init"),
    "initializeBackend": ("popdist.collectives", "init"),  # PopDist's other name for init
    "finalizeBackend": ("popdist.collectives", "finalize"),
    "isBackendInitialized": ("popdist.collectives", "is_initialized"),
    "notice_received": ("popdist.deadline", "notice_received"),
    "should_stop": ("popdist.deadline", "should_stop"),
}


def _start_what_poprun_asked() -> None:
    """Under poprun (its variables set), in this order: an uncaught exception is also
    reported as data; collectives and steps are counted and reported; the time-limit notice
    (SIGUSR1) sets a flag, nothing else; across hosts, an instance cut off from poprun ends
    itself. Each module is imported only when its variable asks for it."""
    environ = os.environ
    if ERROR_RECORD in environ:
        from popdist.error_record import install_if_asked

        install_if_asked()
    if PROGRESS in environ:
        from popdist.progress import start_if_asked

        start_if_asked()
    if NUM_INSTANCES in environ:
        from popdist.deadline import install_if_asked as install_notice

        install_notice()
    if LEASE in environ:
        from popdist.lease import start_if_asked as hold_lease

        hold_lease()


_start_what_poprun_asked()

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
    """The names of :data:`_LAZY` on first use (then kept: no second call for them)."""
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'popdist' has no attribute {name!r}") from None
    import importlib

    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value
