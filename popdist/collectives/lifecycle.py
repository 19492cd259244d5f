"""The collective backend's life cycle, owned in one place: started once, stopped once.

``popdist.init()`` (:func:`init`) brings up the backend that carries host-side collectives
between instances: Horovod over the same Open MPI job poprun launched, or
``torch.distributed`` (gloo on CPU, NCCL on GPU), as ``init(backend=...)`` or
``poprun --backend`` (``POPDIST_BACKEND``) say. The default, ``auto``, is Horovod where
``horovod.torch`` imports on every instance and torch otherwise (:mod:`popdist.collectives.
auto`, resolved once per process, collectively). Under the torch backend Horovod is never
imported. This module decides *which* backend, *when* it starts and stops, and checks that
the backend's world is the run popdist reads from the environment: a process started
outside the job, or a job whose ranks do not match the instances, fails here with a clear
message instead of hanging in its first collective.

The project's own collectives (``execute_on_instances``, the executor, Lightning) ask
:func:`for_run`, the one place that picks the local null backend for a world of one
process: a one-instance run starts nothing and never imports Horovod. A script's explicit
``popdist.init()`` still starts the chosen backend in a one-process run, so its own calls
to that backend work. Backends are created through the registry's lazy factories, so
``import popdist`` imports neither torch nor a backend library.
"""

from __future__ import annotations

import atexit

from popdist.collectives.errors import world_mismatch
from popdist.collectives.registry import AUTO, LOCAL, Capabilities, spec
from popdist.env import PopdistError, read_backend, read_run
from popdist.heap import freeze_imports
from popdist.progress import instrument

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from popdist.collectives.base import Collectives

__all__ = [
    "active",
    "capabilities",
    "finalize",
    "for_run",
    "init",
    "is_initialized",
    "started",
]


class _Run:
    """This process's backends: one object per name, and the one :func:`init` started."""

    objects: dict[str, Collectives] = {}  # noqa: RUF012 - one process, one table
    started: Collectives | None = None
    auto: str | None = None  # what ``auto`` resolved to, once
    spent = False  # a backend that cannot be restarted was shut down
    atexit_registered = False


def _object(name: str) -> Collectives:
    """The process's (one) object of backend ``name``, created on first use, not started."""
    backend = _Run.objects.get(name)
    if backend is None:
        backend = _Run.objects[name] = spec(name).create()
        if name != LOCAL:  # under poprun, its collectives are counted (popdist.progress)
            instrument(backend)
    return backend


def _resolve(name: str) -> str:
    """``name``, or for ``auto`` the backend every instance can run (decided once, together:
    every instance calls this at the same point of the program, as any collective)."""
    if name != AUTO:
        return name
    if _Run.auto is None:
        from popdist.collectives import auto

        _Run.auto = auto.choose(read_run()).name
    return _Run.auto


def active() -> str:
    """The backend :func:`init` started, else the one it would start (``horovod``/``torch``)."""
    return _Run.started.name if _Run.started is not None else _resolve(read_backend())


def init(backend: str | None = None) -> None:
    """Start the collective backend once; later calls do nothing.

    ``backend`` is ``"auto"``, ``"horovod"`` or ``"torch"``; by default ``POPDIST_BACKEND``
    (which ``poprun --backend`` sets), else ``auto``. Raises :class:`PopdistError` if the backend
    is missing, if its size and rank disagree with :func:`popdist.getNumInstances` and
    :func:`popdist.getInstanceIndex`, or if another backend already runs in this process.
    The backend is finalised at interpreter exit (or by :func:`finalize`).
    """
    requested = read_backend(requested=backend)
    if _Run.started is not None:
        if backend is not None and _resolve(requested) != _Run.started.name:
            raise PopdistError(
                f"popdist.init(backend={backend!r}): the {_Run.started.name} backend already "
                f"runs in this process; one process uses one backend"
            )
        return
    if _Run.spent:
        # Horovod finalises MPI on shutdown and MPI cannot be initialised twice in one
        # process: a second start would abort the process inside MPI.
        raise PopdistError(
            "popdist.init() after popdist.finalizeBackend(): the backend cannot be started "
            "twice in one process (MPI allows one initialisation); call finalizeBackend() "
            "only when the script is done with collectives"
        )
    run = read_run()  # a malformed environment fails before anything starts
    name = _resolve(requested)
    started = _object(name)
    started.start()
    size, rank = started.size(), started.rank()
    if (size, rank) != (run.num_instances, run.instance_index):
        started.shutdown()
        raise world_mismatch(started.label or started.name, rank, size, run)
    _Run.started = started
    freeze_imports()  # the backend's libraries are loaded (popdist.heap)
    if not _Run.atexit_registered:
        atexit.register(finalize)
        _Run.atexit_registered = True


def is_initialized() -> bool:
    """Whether :func:`init` started the backend and it is still running."""
    return _Run.started is not None and _Run.started.is_started()


def finalize() -> None:
    """Shut the backend down (idempotent). Horovod cannot be started again in this process."""
    started, _Run.started = _Run.started, None
    if started is None:
        return
    _Run.spent = _Run.spent or not started.capabilities.restartable
    started.shutdown()


def _choice(num_processes: int | None) -> str:
    """The backend the project's collectives use over ``num_processes`` (default: the run)."""
    count = read_run().num_instances if num_processes is None else num_processes
    return LOCAL if count <= 1 else active()


def capabilities(num_processes: int | None = None) -> Capabilities:
    """What :func:`for_run` ``(num_processes)``'s backend can do, without starting it."""
    return spec(_choice(num_processes)).capabilities


def for_run(num_processes: int | None = None) -> Collectives:
    """The collectives over ``num_processes`` processes (default: the run's instances).

    The local null backend for one process (nothing started, no backend library
    imported); otherwise the chosen backend, started by :func:`init` if it is not yet.
    """
    if _choice(num_processes) == LOCAL:
        return _object(LOCAL)
    init()
    assert _Run.started is not None
    return _Run.started


def started() -> Collectives:
    """The backend :func:`init` started (started now if it is not yet), whatever the run's size.

    For a script's own collectives after ``popdist.init()``: unlike :func:`for_run`, a
    one-process run gets the chosen backend itself (Horovod, or torch.distributed's process
    group), not the local null backend.
    """
    init()
    assert _Run.started is not None
    return _Run.started
