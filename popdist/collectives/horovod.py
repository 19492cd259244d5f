"""The Horovod backend (``horovod.torch``) over the Open MPI job poprun launched.

Horovod is imported by :meth:`HorovodCollectives.start` only, never at import time.

Horovod's background thread negotiates which tensors are ready once per *cycle* (1 ms by
default), which adds up to a cycle of latency to every collective. Unless the user set
``HOROVOD_CYCLE_TIME``, :meth:`~HorovodCollectives.start` sets it to :data:`CYCLE_TIME_MS`
before Horovod starts: measured on 2 cores with 2 instances, a 16 MB gradient allreduce
goes from about 3.9 to 5.1 GB/s and MLP training gains about 10 %, while the CPU the faster
cycle costs is given back by the ``mpi_yield_when_idle`` poprun sets when cores are scarce
(``benchmarks/allreduce.py``, ``benchmarks/training_throughput.py``).

The cycle is a sleep, and Linux lets a sleeping thread oversleep by its *timer slack*
(50 µs by default), half of a 0.1 ms cycle. Horovod's background thread is created inside
``hvd.init()`` and inherits the slack of the thread that starts it, so ``start`` lowers
the slack to :data:`TIMER_SLACK_NS` around that call (only there: the caller's own slack is
restored). Measured with 2 instances on 2 cores: a 1 MB allreduce +13 %, 4 MB +7 %.

Waiting is the other side. Stock Horovod's ``hvd.synchronize`` yields in a loop until its
handle is done; this project's build (``scripts/horovod-idle-cycle.patch``) yields for
``HOROVOD_WAIT_SPIN_US`` (1000 µs when unset), then blocks until the handle is done. Where
a host's instances have more busy threads than cores
(:func:`popdist.env.threads_outnumber_cores`, the rule poprun sets ``mpi_yield_when_idle``
by), the yielding caller takes turns on a core with the background threads that move the
data, a scheduler slice at a time: on 2 cores with 2 instances a 1 or 4 MB allreduce took
about 4 ms in some launches (0.1 to 0.9 ms in others). There
:meth:`~HorovodCollectives.start` sets ``HOROVOD_WAIT_SPIN_US=0`` unless the user set it:
the caller blocks at once, and the same allreduces take at most 0.35 and 0.9 ms in every
launch (16 MB: 0.96 of raw MPI, against 0.71 to 0.91; ``docs/performance.md``,
issue 33).

Across hosts an allreduce of 16 MB takes about 15 ms and one of 256 MB 300 ms, and there a
caller that yields or wakes often costs up to half the throughput in some runs (two
namespace hosts on 2 cores: 16 MB 0.20-1.08 and 256 MB 0.46-1.18 of raw MPI's bandwidth).
So when the instances span hosts, :meth:`~HorovodCollectives.wait` for an allreduce of
:data:`LONG_WAIT_BYTES` or more first naps until the handle is done, each nap
:data:`NAP_FRACTION` of the time waited so far (at most :data:`MAX_NAP_S`), so a wait
overshoots by at most that fraction; then it calls ``synchronize``, which returns at once
(256 MB across hosts: 0.98-1.13 GB/s against raw MPI's 1.0). On one host every wait is
Horovod's own: there naps cost a 16 MB allreduce 18 % and gained nothing at 64 and 256 MB
(interleaved A/B rounds of 2 instances of ``benchmarks/allreduce_worker.py``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType

import torch

from popdist.collectives.base import Collectives, Handle
from popdist.collectives.errors import CollectiveError
from popdist.env import local_cores, read_run, threads_outnumber_cores

__all__ = [
    "CYCLE_TIME_MS",
    "LONG_WAIT_BYTES",
    "MAX_NAP_S",
    "NAP_FRACTION",
    "TIMER_SLACK_NS",
    "WAIT_SPIN_VARIABLE",
    "HorovodCollectives",
    "build_info",
    "install_hint",
    "nap_until",
    "unavailable",
]

#: Horovod's negotiation cycle in milliseconds, unless ``HOROVOD_CYCLE_TIME`` is set.
CYCLE_TIME_MS = "0.1"

#: Timer slack (ns) Horovod's background thread inherits: its cycle sleeps end on time.
TIMER_SLACK_NS = 1000
_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30

#: How long our build's ``hvd.synchronize`` yields before it blocks, in µs (1000 unset).
WAIT_SPIN_VARIABLE = "HOROVOD_WAIT_SPIN_US"


#: Across hosts, an allreduce of at least this many bytes is waited for with naps.
LONG_WAIT_BYTES = 4 << 20
#: Each nap is this fraction of the time waited so far: the most a wait overshoots by.
NAP_FRACTION = 0.05
#: The shortest and the longest nap, in seconds.
MIN_NAP_S, MAX_NAP_S = 5e-5, 2e-3


def nap_until(
    done: Callable[[], bool],
    *,
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> None:
    """Return once ``done()`` is true, napping in between: few wake-ups, bounded overshoot."""
    clock = clock or time.perf_counter
    sleep = sleep or time.sleep
    start = clock()
    while not done():
        sleep(min(MAX_NAP_S, max(MIN_NAP_S, (clock() - start) * NAP_FRACTION)))


def install_hint(root: Path | None = None) -> str:
    """How to get Horovod, for the way this project was installed.

    A checkout (``root``, the folder that holds the ``popdist`` package, has
    ``scripts/setup.sh``, as an editable install from the repository does) builds it with its
    set-up script; a pip install has no such script, so pip builds Horovod from its sources.
    Both may use the torch backend instead.
    """
    setup = (root or Path(__file__).resolve().parents[2]) / "scripts" / "setup.sh"
    instead = "or run with --backend torch (or auto), which needs nothing more"
    if setup.is_file():
        return f"build it into this environment with `bash {setup}`, {instead}"
    return (
        f"Horovod is not a dependency of popdist-open: build it into this environment with "
        f"`HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 {sys.executable} -m pip install "
        f"--no-build-isolation horovod` (it needs cmake, a C++17 compiler and Open MPI's "
        f"headers), {instead}"
    )


def _import_horovod() -> ModuleType:
    try:
        import horovod.torch as hvd
    except ImportError as exc:
        raise CollectiveError(
            f"the horovod backend needs Horovod (horovod.torch), which this interpreter "
            f"({sys.executable}) cannot import ({exc}); {install_hint()}"
        ) from None
    module: ModuleType = hvd
    return module


def build_info() -> dict[str, object]:
    """Horovod's version and what it was built with: its controllers and tensor operations
    (the lists ``horovodrun --check-build`` prints). Raises ImportError without Horovod."""
    from importlib import metadata

    import horovod.torch as hvd

    return {
        # The distribution's version, with its local label: scripts/setup.sh's build
        # (patched: scripts/horovod-idle-cycle.patch) is 0.28.1+popdist3.
        "version": metadata.version("horovod"),
        "controllers": {"MPI": bool(hvd.mpi_built()), "Gloo": bool(hvd.gloo_built())},
        "operations": {
            "NCCL": bool(hvd.nccl_built()),
            "DDL": bool(hvd.ddl_built()),
            "CCL": bool(hvd.ccl_built()),
            "MPI": bool(hvd.mpi_built()),
            "Gloo": bool(hvd.gloo_built()),
        },
    }


def unavailable() -> str | None:
    """Why this interpreter cannot run Horovod (``None``: ``horovod.torch`` imports)."""
    try:
        import horovod.torch  # noqa: F401
    except Exception as exc:  # an ImportError, or a library built for another torch
        return f"horovod.torch does not import ({type(exc).__name__}: {exc})"
    return None


@contextlib.contextmanager
def _timer_slack(nanoseconds: int) -> Iterator[None]:
    """This thread's timer slack (so that of the threads it starts) within the block; Linux."""
    if sys.platform != "linux":
        yield
        return
    import ctypes

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


class HorovodCollectives(Collectives):
    """:class:`Collectives` on ``horovod.torch``: fused, background-thread allreduces."""

    name = "horovod"
    label = "Horovod"

    def __init__(self) -> None:
        self._hvd: ModuleType | None = None
        self._long_waits: set[int] = set()  # handles of allreduces waited for with naps
        self._long_wait_bytes: int | None = None  # None: one host, Horovod's waits only

    @property
    def hvd(self) -> ModuleType:
        """``horovod.torch`` (the backend must be started)."""
        if self._hvd is None:
            raise CollectiveError("the Horovod backend is not started: call popdist.init() first")
        return self._hvd

    def start(self) -> None:
        if self.is_started():
            return
        hvd = _import_horovod()
        run = read_run()
        os.environ.setdefault("HOROVOD_CYCLE_TIME", CYCLE_TIME_MS)
        if threads_outnumber_cores(run.num_local_instances, local_cores()):
            os.environ.setdefault(WAIT_SPIN_VARIABLE, "0")
        with _timer_slack(TIMER_SLACK_NS):
            hvd.init()
        self._hvd = hvd
        across_hosts = run.num_local_instances < run.num_instances
        self._long_wait_bytes = LONG_WAIT_BYTES if across_hosts else None

    def is_started(self) -> bool:
        return self._hvd is not None and bool(self._hvd.is_initialized())

    def shutdown(self) -> None:
        hvd, self._hvd = self._hvd, None
        self._long_waits.clear()
        if hvd is not None and hvd.is_initialized():
            hvd.shutdown()

    def rank(self) -> int:
        return int(self.hvd.rank())

    def size(self) -> int:
        return int(self.hvd.size())

    def allreduce_async_(
        self, tensor: torch.Tensor, *, average: bool = False, name: str | None = None
    ) -> Handle:
        hvd = self.hvd
        handle = hvd.allreduce_async_(tensor, name=name, op=hvd.Average if average else hvd.Sum)
        limit = self._long_wait_bytes
        if limit is not None and tensor.numel() * tensor.element_size() >= limit:
            self._long_waits.add(handle)
        return handle

    def wait(self, handle: Handle) -> None:
        hvd = self.hvd
        if handle in self._long_waits:
            self._long_waits.discard(handle)
            nap_until(lambda: bool(hvd.poll(handle)))
        hvd.synchronize(handle)

    def broadcast_(
        self, tensor: torch.Tensor, *, root: int = 0, name: str | None = None
    ) -> torch.Tensor:
        result: torch.Tensor = self.hvd.broadcast_(tensor, root_rank=root, name=name)
        return result

    def allgather(self, tensor: torch.Tensor, *, name: str | None = None) -> torch.Tensor:
        result: torch.Tensor = self.hvd.allgather(tensor, name=name)
        return result

    def barrier(self) -> None:
        self.hvd.barrier()

    def broadcast_tensors(
        self, named: Iterable[tuple[str, torch.Tensor]], *, root: int = 0
    ) -> None:
        # Horovod's helper launches every broadcast before waiting for any.
        self.hvd.broadcast_parameters(list(named), root_rank=root)

    def broadcast_optimizer_state(self, optimizer: torch.optim.Optimizer, *, root: int = 0) -> None:
        self.hvd.broadcast_optimizer_state(optimizer, root_rank=root)
