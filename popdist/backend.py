"""The collective backend, started once per process by :func:`init`.

PopDist's ``init()`` brings up the backend that carries host-side collectives between
instances. Two are available: Horovod (``horovod.torch``, the default) over the same Open
MPI job that poprun launched, and ``torch.distributed`` (gloo on CPU, NCCL on GPU;
:mod:`popdist.torch_distributed`), chosen by ``init(backend="torch")`` or by
``poprun --backend torch`` (``POPDIST_BACKEND``). Under the torch backend Horovod is never
imported. The rest of this docstring is about Horovod. Horovod (and with it torch) is imported only when :func:`init` runs, so
``import popdist`` stays cheap. :func:`init` also checks that Horovod's world is the run
popdist reads from the environment: a process started outside the job, or a job whose
ranks do not match the instances, fails here with a clear message instead of hanging in
its first collective.

Horovod's background thread negotiates which tensors are ready once per *cycle* (1 ms by
default), which adds up to a cycle of latency to every collective. Unless the user set
``HOROVOD_CYCLE_TIME``, :func:`init` sets it to :data:`CYCLE_TIME_MS` before Horovod
starts: measured on 2 cores with 2 instances, a 16 MB gradient allreduce goes from about
3.9 to 5.1 GB/s and MLP training gains about 10 %, while the CPU the faster cycle costs is
given back by the ``mpi_yield_when_idle`` poprun sets when cores are scarce
(``benchmarks/allreduce.py``, ``benchmarks/training_throughput.py``).

The cycle is a sleep, and Linux lets a sleeping thread oversleep by its *timer slack*
(50 µs by default), half of a 0.1 ms cycle. Horovod's background thread is created inside
``hvd.init()`` and inherits the slack of the thread that starts it, so :func:`init` lowers
the slack to :data:`TIMER_SLACK_NS` around that call (only there: the caller's own slack is
restored). Measured with 2 instances on 2 cores: a 1 MB allreduce +13 %, 4 MB +7 %.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType

from popdist import torch_distributed
from popdist.env import PopdistError, read_backend, read_run

__all__ = [
    "active",
    "finalizeBackend",
    "horovod",
    "init",
    "initializeBackend",
    "isBackendInitialized",
]

SETUP_HINT = "run `make setup` (which `make test` and `make demo` run first) to build it into .venv"

#: Horovod's negotiation cycle in milliseconds, unless ``HOROVOD_CYCLE_TIME`` is set.
CYCLE_TIME_MS = "0.1"

#: Timer slack (ns) Horovod's background thread inherits: its cycle sleeps end on time.
TIMER_SLACK_NS = 1000
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30

_initialized = False
_finalized = False
_atexit_registered = False
_active: str | None = None  # the backend init() started


def _import_horovod() -> ModuleType:
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise PopdistError(
            f"popdist.init() needs Horovod (horovod.torch), which this interpreter "
            f"({sys.executable}) cannot import ({exc}); {SETUP_HINT}"
        ) from None
    return hvd


def active() -> str:
    """The backend :func:`init` started, or the one it would start (``horovod``/``torch``)."""
    return _active if _active is not None else read_backend()


def init(backend: str | None = None) -> None:
    """Start the collective backend once; later calls do nothing.

    ``backend`` is ``"horovod"`` or ``"torch"``; by default ``POPDIST_BACKEND`` (set by
    ``poprun --backend``), else Horovod. Raises :class:`PopdistError` if the backend is
    missing, if its size and rank disagree with :func:`popdist.getNumInstances` and
    :func:`popdist.getInstanceIndex`, or if another backend is already running. The
    backend is finalised at interpreter exit (or by :func:`finalizeBackend`).
    """
    global _initialized, _atexit_registered, _active
    name = read_backend(requested=backend)
    if _initialized:
        if backend is not None and name != _active:
            raise PopdistError(
                f"popdist.init(backend={backend!r}): the {_active} backend is already running "
                f"in this process; one process uses one backend"
            )
        return
    if name == "torch":
        torch_distributed.start(read_run())
        _active, _initialized = name, True
        _register_finalizer()
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
    hvd = _import_horovod()
    os.environ.setdefault("HOROVOD_CYCLE_TIME", CYCLE_TIME_MS)
    with _timer_slack(TIMER_SLACK_NS):
        hvd.init()
    size, rank = int(hvd.size()), int(hvd.rank())
    if (size, rank) != (run.num_instances, run.instance_index):
        hvd.shutdown()
        where = "poprun's POPDIST_*" if run.from_poprun else "the environment"
        raise PopdistError(
            f"Horovod sees rank {rank} of {size} processes but {where} says instance "
            f"{run.instance_index} of {run.num_instances}: start every instance from one "
            f"poprun (or mpirun) command and do not mix launchers"
        )
    _active, _initialized = name, True
    _register_finalizer()


def _register_finalizer() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(finalizeBackend)
        _atexit_registered = True


@contextlib.contextmanager
def _timer_slack(nanoseconds: int) -> Iterator[None]:
    """This thread's timer slack (so that of the threads it starts) within the block; Linux."""
    if sys.platform != "linux":
        yield
        return
    import ctypes  # here, not at the top: ``import popdist`` stays light

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    zero = ctypes.c_ulong(0)
    before = int(prctl(_PR_GET_TIMERSLACK, zero, zero, zero, zero))
    if before <= 0 or prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(nanoseconds), zero, zero, zero):
        yield  # the call failed: leave the slack alone
        return
    try:
        yield
    finally:
        prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(before), zero, zero, zero)


#: PopDist's other name for :func:`init`.
initializeBackend = init


def isBackendInitialized() -> bool:
    """Whether :func:`init` started the backend and it is still running."""
    if not _initialized:
        return False
    if _active == "torch":
        return torch_distributed.is_initialized()
    hvd = sys.modules.get("horovod.torch")
    return bool(hvd is not None and hvd.is_initialized())


def finalizeBackend() -> None:
    """Shut the backend down (idempotent). Horovod cannot be started again in this process."""
    global _initialized, _finalized, _active
    if not _initialized:
        return
    _initialized = False
    if _active == "torch":
        _active = None
        torch_distributed.stop()
        return
    _active = None
    _finalized = True
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()


def horovod() -> ModuleType:
    """``horovod.torch``, started by :func:`init` if it is not yet."""
    init()
    if _active != "horovod":
        raise PopdistError(
            f"popdist.backend.horovod(): this process runs the {_active} backend, not Horovod; "
            f"launch with --backend horovod to use Horovod's API"
        )
    return _import_horovod()
