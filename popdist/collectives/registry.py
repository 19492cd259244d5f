"""The backends by name: a lazy factory and the capabilities each one declares.

A :class:`BackendSpec` names the class that implements a backend as ``"module:Class"``, so
reading the registry (or a backend's capabilities) imports neither the backend's module
nor its library: ``import popdist`` stays cheap and a one-instance run never imports
Horovod. The names a user can choose (``popdist.init(backend=...)``, ``poprun --backend``)
are the environment contract's :data:`popdist.env.BACKENDS`, whose first, ``auto``, is the
default: :mod:`popdist.collectives.auto` picks the first of :data:`PREFERENCE` whose probe
passes on every instance. :data:`LOCAL` is the null backend the project's own collectives use
over a world of one process (:mod:`popdist.collectives.local`).

Callers ask a backend for a capability (:class:`Capabilities`), never for its name.
*Seam:* a new backend is one :class:`Collectives <popdist.collectives.base.Collectives>`
subclass and one :class:`BackendSpec` in :data:`REGISTRY` (plus its name in
``popdist.env.BACKENDS`` if users may choose it).
"""

from __future__ import annotations

import importlib

from popdist.collectives.errors import CollectiveError
from popdist.env import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["AUTO", "LOCAL", "PREFERENCE", "REGISTRY", "BackendSpec", "Capabilities", "spec"]

#: The null backend's name: one process, every collective keeps its input.
LOCAL = "local"
#: The name that asks for the first backend of :data:`PREFERENCE` the job can use.
AUTO = "auto"
#: What ``auto`` tries, in order: Horovod when it imports, else torch.distributed.
PREFERENCE: tuple[str, ...] = ("horovod", "torch")


class Capabilities(Record):
    """What a backend can do, declared without importing it.

    ``devices``: the device types whose tensors it reduces (``None``: any, as the null
    backend, which moves nothing); ``asynchronous``: an ``allreduce_async_`` overlaps the
    caller's work (a background thread fuses them); ``broadcasts_objects``: it carries any
    object ``torch.save`` takes; ``restartable``: it can be started again in the same
    process after it was shut down (Horovod's shutdown finalises MPI, which cannot be
    initialised twice); ``communicates``: it exchanges data with other processes.
    (A :class:`~popdist.env.Record`, not a dataclass: ``import dataclasses`` is costly.)
    """

    __slots__ = (  # noqa: RUF023 - declaration order is the field order
        "devices",
        "asynchronous",
        "broadcasts_objects",
        "restartable",
        "communicates",
    )
    devices: frozenset[str] | None
    asynchronous: bool
    broadcasts_objects: bool
    restartable: bool
    communicates: bool

    def __init__(
        self,
        devices: frozenset[str] | None,
        *,
        asynchronous: bool = True,
        broadcasts_objects: bool = True,
        restartable: bool = True,
        communicates: bool = True,
    ) -> None:
        self._init(
            devices=devices,
            asynchronous=asynchronous,
            broadcasts_objects=broadcasts_objects,
            restartable=restartable,
            communicates=communicates,
        )

    def reduces_on(self, device_type: str) -> bool:
        """Whether the backend reduces tensors of ``device_type`` (``"cpu"``, ``"cuda"``)."""
        return self.devices is None or device_type in self.devices


class BackendSpec(Record):
    """One registered backend: its name, where its class lives (``"module:Class"``, imported
    by :meth:`create` only), what it can do, and its probe (``"module:function"``, called by
    :meth:`unavailable` only)."""

    __slots__ = ("name", "factory", "capabilities", "probe")  # noqa: RUF023 - field order
    name: str
    factory: str
    capabilities: Capabilities
    probe: str | None

    def __init__(
        self, name: str, factory: str, capabilities: Capabilities, probe: str | None = None
    ) -> None:
        self._init(name=name, factory=factory, capabilities=capabilities, probe=probe)

    def unavailable(self) -> str | None:
        """Why this interpreter cannot run the backend (``None``: it can).

        Imports the backend's module and, to be sure, its library: a library that is
        installed but does not import (built for another torch) is unavailable too.
        """
        if self.probe is None:
            return None
        module, _, attribute = self.probe.partition(":")
        reason: str | None = getattr(importlib.import_module(module), attribute)()
        return reason

    def create(self) -> Any:
        """A new, unstarted :class:`~popdist.collectives.base.Collectives` of the backend.

        Imports the backend's module, not its library. (Typed ``Any``: the interface
        imports the registry for its capabilities, so the registry does not import it.)
        """
        module, _, attribute = self.factory.partition(":")
        return getattr(importlib.import_module(module), attribute)()


#: Every backend by name.
REGISTRY: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec(
            "horovod",
            "popdist.collectives.horovod:HorovodCollectives",
            # This Horovod build has no GPU collectives.
            Capabilities(devices=frozenset({"cpu"}), restartable=False),
            "popdist.collectives.horovod:unavailable",
        ),
        BackendSpec(
            "torch",
            "popdist.collectives.torchdist:TorchCollectives",
            # gloo on CPU; NCCL for CUDA tensors when every instance has a GPU.
            Capabilities(devices=frozenset({"cpu", "cuda"})),
            "popdist.collectives.torchdist:unavailable",
        ),
        BackendSpec(
            LOCAL,
            "popdist.collectives.local:LocalCollectives",
            Capabilities(devices=None, asynchronous=False, communicates=False),
        ),
    )
}


def spec(name: str) -> BackendSpec:
    """The registered backend ``name``; :class:`CollectiveError` naming the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise CollectiveError(
            f"collectives backend {name!r} is unknown: expected one of {sorted(REGISTRY)}"
        ) from None
