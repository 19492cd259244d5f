"""The collective backend's life cycle: started once per process by :func:`init`.

PopDist's ``init()`` brings up the backend that carries host-side collectives between
instances. The backend itself is ``popdist_torch.collectives``: Horovod by default, over the
same Open MPI job poprun launched, or ``torch.distributed`` (gloo on CPU, NCCL on GPU) with
``init(backend="torch")`` or ``poprun --backend torch`` (``POPDIST_BACKEND``; its start-up is
:mod:`popdist.torch_distributed`). Under the torch backend Horovod is never imported. This
module only decides *which* backend, *when* it starts and stops, and
checks that the backend's world is the run popdist reads from the environment: a process
started outside the job, or a job whose ranks do not match the instances, fails here with a
clear message instead of hanging in its first collective. The backend (and with it torch)
is imported only when :func:`init` runs, so ``import popdist`` stays cheap.
"""

from __future__ import annotations

import atexit

from popdist.env import PopdistError, RunView, read_backend, read_run

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from popdist_torch.collectives import Collectives

__all__ = [
    "active",
    "collectives",
    "finalizeBackend",
    "init",
    "initializeBackend",
    "isBackendInitialized",
]

_initialized = False
_finalized = False
_atexit_registered = False
_active: str | None = None  # the backend init() started


def _backend() -> Collectives:
    from popdist_torch import collectives as chosen

    return chosen.backend()


def active() -> str:
    """The backend :func:`init` started, else the one it would start (``horovod``/``torch``)."""
    return _active if _active is not None else read_backend()


def init(backend: str | None = None) -> None:
    """Start the collective backend once; later calls do nothing.

    ``backend`` is ``"horovod"`` or ``"torch"``; by default ``POPDIST_BACKEND`` (which
    ``poprun --backend`` sets), else Horovod. Raises :class:`PopdistError` if the backend
    is missing, if its size and rank disagree with :func:`popdist.getNumInstances` and
    :func:`popdist.getInstanceIndex`, or if another backend already runs in this process.
    The backend is finalised at interpreter exit (or by :func:`finalizeBackend`).
    """
    global _initialized, _atexit_registered, _active
    name = read_backend(requested=backend)
    if _initialized:
        if name != _active and backend is not None:
            raise PopdistError(
                f"popdist.init(backend={backend!r}): the {_active} backend already runs in "
                f"this process; one process uses one backend"
            )
        return
    if _finalized:
        # Horovod finalises MPI on shutdown and MPI cannot be initialised twice in one
        # process: a second start would abort the process inside MPI.
        raise PopdistError(
            "popdist.init() after popdist.finalizeBackend(): the backend cannot be started "
            "twice in one process (MPI allows one initialisation); call finalizeBackend() "
            "only when the script is done with collectives"
        )
    run = read_run()  # a malformed environment fails before anything starts
    from popdist_torch import collectives as chosen

    chosen.use(name)
    started = chosen.backend()
    started.start()
    size, rank = started.size(), started.rank()
    if (size, rank) != (run.num_instances, run.instance_index):
        started.shutdown()
        raise world_mismatch(started.label or started.name, rank, size, run)
    _active, _initialized = name, True
    if not _atexit_registered:
        atexit.register(finalizeBackend)
        _atexit_registered = True


def world_mismatch(who: str, rank: int, size: int, run: RunView) -> PopdistError:
    """The error for a backend (``who``) whose world is not the run the environment gives."""
    where = "poprun's POPDIST_*" if run.from_poprun else "the environment"
    return PopdistError(
        f"{who} sees rank {rank} of {size} processes but {where} says instance "
        f"{run.instance_index} of {run.num_instances}: start every instance from one poprun "
        f"(or mpirun) command and do not mix launchers"
    )


#: PopDist's other name for :func:`init`.
initializeBackend = init


def isBackendInitialized() -> bool:
    """Whether :func:`init` started the backend and it is still running."""
    return _initialized and _backend().is_started()


def finalizeBackend() -> None:
    """Shut the backend down (idempotent). Horovod cannot be started again in this process."""
    global _initialized, _finalized, _active
    if not _initialized:
        return
    _initialized = False
    _finalized = _finalized or _active == "horovod"
    _active = None
    _backend().shutdown()


def collectives() -> Collectives:
    """The backend's collectives, started by :func:`init` if they are not yet."""
    init()
    return _backend()
