"""Collectives between instances: one interface, its backends, and what the executor builds on it.

:class:`~popdist_torch.collectives.base.Collectives` is the interface; Horovod
(:mod:`popdist_torch.collectives.horovod`) is the default backend, ``torch.distributed``
(:mod:`popdist_torch.collectives.torchdist`: gloo on CPU, NCCL on GPU) the second.
:func:`backend` gives the process's backend object (one per process: MPI starts once),
``popdist.init()`` starts it, :func:`connect` starts it and checks it against the options. :class:`GradientReducer` and
:func:`broadcast_state` are the executor's gradient and wrap-time state paths, written
against the interface only. Only the backend modules import a backend library.
"""

from __future__ import annotations

from collections.abc import Callable

from popdist_torch.collectives.base import Collectives, Handle
from popdist_torch.collectives.horovod import HorovodCollectives
from popdist_torch.collectives.reducer import GradientReducer, broadcast_state
from popdist_torch.collectives.torchdist import TorchCollectives
from popdist_torch.errors import CollectiveError

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "CollectiveError",
    "Collectives",
    "GradientReducer",
    "Handle",
    "backend",
    "broadcast_state",
    "connect",
    "use",
]

#: The backends by name: a factory of each one's (unstarted) object.
BACKENDS: dict[str, Callable[[], Collectives]] = {
    "horovod": HorovodCollectives,
    "torch": TorchCollectives,
}
DEFAULT_BACKEND = "horovod"

_choice = DEFAULT_BACKEND
_backend: Collectives | None = None


def use(name: str) -> None:
    """Choose the backend this process will start (before anything started one)."""
    global _choice, _backend
    if name not in BACKENDS:
        raise CollectiveError(
            f"collectives backend {name!r} is unknown: expected one of {sorted(BACKENDS)}"
        )
    if _backend is not None and _backend.name != name:
        if _backend.is_started():
            raise CollectiveError(
                f"collectives backend {name!r} requested but {_backend.name!r} is already "
                f"running in this process: choose the backend before popdist.init()"
            )
        _backend = None
    _choice = name


def backend() -> Collectives:
    """This process's backend object (created on first use; :meth:`~Collectives.start` it)."""
    global _backend
    if _backend is None:
        _backend = BACKENDS[_choice]()
    return _backend


def connect(num_processes: int, process_id: int) -> Collectives:
    """The started backend (``popdist.init()``), checked against the options' process id/count."""
    import popdist

    popdist.init()
    collectives = backend()
    if collectives.size() != num_processes or collectives.rank() != process_id:
        raise CollectiveError(
            f"Options.Distributed says process {process_id} of {num_processes} but the "
            f"{collectives.name} backend has rank {collectives.rank()} of {collectives.size()}: "
            f"launch with poprun (or mpirun -np {num_processes}) and leave Options.Distributed "
            f"at its default"
        )
    return collectives
