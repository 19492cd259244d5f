"""Collectives between instances: one interface, a registry of backends, one life cycle.

:class:`~popdist.collectives.base.Collectives` is the interface. The registry
(:mod:`popdist.collectives.registry`) names each backend's class and declares its
:class:`Capabilities`: Horovod (:mod:`~popdist.collectives.horovod`),
``torch.distributed`` (:mod:`~popdist.collectives.torchdist`: gloo on CPU, NCCL on GPU) and
the local null backend of a one-process world (:mod:`~popdist.collectives.local`). The
default, ``auto`` (:mod:`~popdist.collectives.auto`), is the first of Horovod and torch that
every instance can run. The life
cycle (:mod:`~popdist.collectives.lifecycle`) is ``popdist.init()``'s: :func:`init`,
:func:`finalize`, and :func:`for_run`, the collectives the project's own code uses. Callers
ask for a capability, never a backend's name. Only the backend modules import a backend
library, and nothing here imports torch until a backend is created.
"""

from __future__ import annotations

from popdist.collectives.errors import CollectiveError
from popdist.collectives.lifecycle import (
    active,
    capabilities,
    finalize,
    for_run,
    init,
    is_initialized,
    started,
)
from popdist.collectives.registry import LOCAL, REGISTRY, BackendSpec, Capabilities, spec

__all__ = [
    "LOCAL",
    "REGISTRY",
    "BackendSpec",
    "Capabilities",
    "CollectiveError",
    "active",
    "capabilities",
    "finalize",
    "for_run",
    "init",
    "is_initialized",
    "spec",
    "started",
]
