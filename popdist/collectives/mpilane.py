"""The torch backend's CPU gradient allreduces over MPI, on a thread of their own.

On CPU, torch.distributed's collectives are gloo's, and gloo moves every byte over TCP, even
between instances on one host, where Open MPI uses shared memory. Side by side, 2 instances
on one host (``benchmarks/torch_backend.py``): gloo reached 0.28, 0.76 and 0.68 of
``MPI_Allreduce``'s bandwidth at 16, 64 and 256 MB. The instances of a run with more than one
of them always share an MPI job (poprun launches them with ``mpirun``, and the torch backend
finds instance 0's store over it), so the torch backend reduces its CPU buckets there: one
:class:`MpiLane` per process, a thread calling ``MPI_Allreduce`` in place on each bucket in
the order they were launched, on a communicator of its own (``COMM_WORLD.Dup()``, so no
message of the program's own MPI calls can match one of these). mpi4py releases the GIL for
the call, so the reduction overlaps the rest of the backward pass, as gloo's worker threads
do; a waiter blocks on a lock, it does not poll. A waiter whose work is the newest and
not yet started runs it itself (:meth:`MpiLane.run_here`).

The lane calls MPI from a thread of its own while the program's thread may call MPI too,
which MPI allows only at ``MPI_THREAD_MULTIPLE``. mpi4py asks for it, but MPI may grant
less (a build without thread support, or MPI started by someone asking for less): then
there is no lane (:func:`threads_allowed`), the CPU buckets stay on the process group, and
one warning says so.

The user can keep every CPU collective on gloo (:func:`popdist.env.read_torch_cpu_allreduce`
reads the choice). CUDA tensors always go to NCCL, and the rest of the torch backend
(broadcasts, allgathers, barriers, and a program's own ``torch.distributed`` calls) stays on
the process group.
"""

from __future__ import annotations

import collections
import sys
import threading
import warnings
from typing import Any

import torch

from popdist.collectives.errors import CollectiveError

__all__ = ["MPI_DTYPES", "MpiLane", "MpiWork", "threads_allowed"]

#: The dtypes the lane reduces (the others go to gloo): those MPI and numpy both have.
MPI_DTYPES = frozenset({torch.float32, torch.float64, torch.int32, torch.int64})


_warned = False  # the lane-less fallback is reported once per process


def threads_allowed(mpi: Any) -> bool:
    """Whether MPI (``mpi4py.MPI``, started) granted ``MPI_THREAD_MULTIPLE``; warns once if not."""
    global _warned
    granted = int(mpi.Query_thread())
    if granted >= int(mpi.THREAD_MULTIPLE):
        return True
    if not _warned:
        _warned = True
        warnings.warn(
            f"MPI granted thread level {granted}, not MPI_THREAD_MULTIPLE "
            f"({int(mpi.THREAD_MULTIPLE)}): the torch backend reduces CPU gradients over its "
            f"process group (gloo) instead of on an MPI thread",
            RuntimeWarning,
            stacklevel=2,
        )
    return False


class MpiWork:
    """One bucket's allreduce on the lane: ``wait`` returns when it is done.

    Done is a lock held until :meth:`finish`, not a ``threading.Event``: an Event is a
    Condition, a lock and some Python on every bucket, and this runs between the end of the
    backward pass and the allreduce, where the interpreter's own data is out of the caches.
    """

    __slots__ = ("_done", "claimed", "error", "lane", "seq", "tensor")

    def __init__(self, lane: MpiLane, tensor: torch.Tensor, seq: int) -> None:
        self.lane, self.tensor, self.seq = lane, tensor, seq
        self.claimed = False  # by the lane's thread or by a waiter (under the lane's lock)
        self.error: Exception | None = None
        self._done = threading.Lock()
        self._done.acquire()  # released by finish()

    def finish(self, error: Exception | None) -> None:
        self.error = error
        self._done.release()

    def wait(self) -> None:
        if self._done.locked():
            self.lane.run_here(self)
        with self._done:  # returns once finish() released it
            pass
        if self.error is not None:
            raise CollectiveError(
                f"the MPI allreduce of a {tuple(self.tensor.shape)} {self.tensor.dtype} "
                f"gradient bucket failed: {self.error}"
            ) from self.error


class MpiLane:
    """A thread running in-place sum-allreduces over MPI, in submission order.

    Every instance must submit the same tensors (shapes, dtypes) in the same order: the
    gradient buckets of one model and autograd graph are.
    """

    def __init__(self, comm: Any, mpi: Any) -> None:
        """A lane over ``comm``'s ranks; ``mpi`` is ``mpi4py.MPI`` (its ``IN_PLACE``, ``SUM``)."""
        self._mpi = mpi
        self._comm = comm.Dup()  # collective: every instance builds its lane at start-up
        self._types = {
            torch.float32: mpi.FLOAT,
            torch.float64: mpi.DOUBLE,
            torch.int32: mpi.INT32_T,
            torch.int64: mpi.INT64_T,
        }
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition(threading.Lock())
        self._pending: collections.deque[MpiWork] = collections.deque()
        self._closing = False
        self._submitted = self._finished = 0  # sequence numbers: works run in this order

    @classmethod
    def for_world(cls) -> MpiLane | None:
        """A lane over the MPI job, or ``None`` when there is no MPI job of several ranks, or
        when MPI does not allow calls from several threads (:func:`threads_allowed`).

        MPI is not started here: only a process that already imported ``mpi4py.MPI`` (the
        torch backend's rendezvous does) gets a lane.
        """
        MPI = sys.modules.get("mpi4py.MPI")
        if (
            MPI is None
            or not MPI.Is_initialized()
            or MPI.Is_finalized()
            or MPI.COMM_WORLD.Get_size() < 2
            or not threads_allowed(MPI)
        ):
            return None
        return cls(MPI.COMM_WORLD, MPI)

    @staticmethod
    def takes(tensor: torch.Tensor) -> bool:
        """Whether the lane can reduce ``tensor`` (a contiguous CPU tensor of an MPI dtype)."""
        return tensor.device.type == "cpu" and tensor.dtype in MPI_DTYPES

    def submit(self, tensor: torch.Tensor, *, wake: bool = True) -> MpiWork:
        """Queue the in-place sum of ``tensor`` (contiguous) over every instance.

        ``wake=False``: the caller waits for it next, so the thread is not woken for it;
        the waiter runs it (:meth:`run_here`) or wakes the thread then.
        """
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="popdist-torch-mpi-allreduce", daemon=True
            )
            self._thread.start()
        with self._cond:
            self._submitted += 1
            work = MpiWork(self, tensor, self._submitted)
            self._pending.append(work)
            if wake:
                self._cond.notify()
        return work

    def run_here(self, work: MpiWork) -> None:
        """Run ``work`` on the calling (waiting) thread if that keeps the order.

        When the waiter wants the newest work and every earlier one has finished, the
        thread has nothing to run before it: running it here saves waking the thread and
        two hand-offs (each wake-up takes a core from an MPI call in flight). Otherwise
        the thread runs it, in order.
        """
        with self._cond:
            mine = (
                not work.claimed and work.seq == self._submitted and self._finished == work.seq - 1
            )
            if mine:
                work.claimed = True
                if self._pending and self._pending[-1] is work:
                    self._pending.pop()
            else:
                self._cond.notify()  # it may have been queued without waking the thread
        if mine:
            self._reduce(work)

    def _next(self) -> MpiWork | None:
        """The next work the thread runs (``None``: closed), claimed."""
        with self._cond:
            while True:
                while self._pending:
                    work = self._pending.popleft()
                    if not work.claimed:
                        work.claimed = True
                        return work
                if self._closing:
                    return None
                self._cond.wait()

    def _run(self) -> None:
        while (work := self._next()) is not None:
            self._reduce(work)

    def _reduce(self, work: MpiWork) -> None:
        error: Exception | None = None
        try:
            # The tensor's memory as MPI sees it, without building a numpy array (detach and
            # numpy take several times longer, most of it when the caches are cold).
            tensor = work.tensor
            mpi = self._mpi
            memory = mpi.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes)
            self._comm.Allreduce(mpi.IN_PLACE, [memory, self._types[tensor.dtype]], op=mpi.SUM)
        except Exception as exc:  # handed to the waiter
            error = exc
        finally:  # a Ctrl-C in an inline run goes on up, from the waiter's own call
            with self._cond:
                self._finished = work.seq
            work.finish(error)

    def close(self) -> None:
        """Finish the queued allreduces, stop the thread and free the communicator."""
        if self._thread is not None:
            with self._cond:
                self._closing = True
                self._cond.notify()
            self._thread.join()
            self._thread = None
        if not self._mpi.Is_finalized():
            self._comm.Free()
