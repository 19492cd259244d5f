"""The second backend: ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Chosen by ``popdist.init(backend="torch")`` or ``poprun --backend torch`` (which exports the
backend in the environment contract). Rank and size are the instance index and count popdist reads
from the environment; no ``MASTER_ADDR``/``MASTER_PORT`` is needed. Instance 0 opens a
``TCPStore`` on a port the kernel picks (port 0: two jobs on one host never collide, and
nothing races between choosing a port and binding it) and sends its address to the other
instances over the MPI job poprun started (an ``mpi4py`` broadcast, as Lightning's
``MPIEnvironment`` does); the store then carries ``torch.distributed``'s own rendezvous.
A single instance (an explicit ``popdist.init()`` in one process: the project's own
collectives use the local backend there) needs no MPI at all: an in-memory store.

The process group is gloo when any instance has no GPU (or runs ``--offline-mode``), and
``cpu:gloo,cuda:nccl`` when every instance has one: CUDA tensors go over NCCL, the few CPU
tensors popdist itself exchanges (``execute_on_instances``' flags) over gloo. Every
instance must pick the same, so the choice is agreed over MPI (the minimum of "has a GPU").

Gradients arrive one parameter at a time (``popdist_torch``'s ``GradientReducer``).
torch.distributed does not fuse, so this backend does, as DDP's buckets do: consecutive
tensors of one dtype and device are packed into a bucket of up to :data:`BUCKET_BYTES`
(the first bucket after a wait up to :data:`FIRST_BUCKET_BYTES`, so that communication
starts early in the backward pass, as DDP's first bucket does),
reduced with one asynchronous ``all_reduce`` when the bucket is full (overlapping the rest
of the backward pass) or when someone waits for it, and unpacked on wait. A tensor larger
than a bucket is reduced in place, without a copy. Every instance reduces the same
gradients in the same order (the same model and autograd graph), which is what a
torch.distributed collective needs; Horovod instead negotiates by name.

CPU buckets of an MPI dtype are reduced over MPI by an :class:`~popdist.collectives.
mpilane.MpiLane` when the run has several instances (gloo's TCP reached 0.28-0.76 of
``MPI_Allreduce`` on one host; see that module), unless the user chose gloo
(:func:`popdist.env.read_torch_cpu_allreduce`).

Horovod is never imported here; torch.distributed and mpi4py only by :meth:`start`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from typing import Any

import torch

from popdist.collectives.base import Collectives, Handle
from popdist.collectives.errors import CollectiveError, world_mismatch
from popdist.collectives.mpilane import MpiLane
from popdist.env import RunView, read_run, read_torch_cpu_allreduce, read_torch_timeout

__all__ = [
    "BUCKET_BYTES",
    "FIRST_BUCKET_BYTES",
    "TorchCollectives",
    "build_info",
    "device_index",
    "process_group_backend",
    "rendezvous_host",
    "unavailable",
]

#: Fusion buffer: DDP's default bucket size.
BUCKET_BYTES = 25 << 20
#: The first bucket after a wait (the start of a backward pass): DDP's first bucket size.
FIRST_BUCKET_BYTES = 1 << 20

_LOOPBACK = frozenset({"", "localhost", "127.0.0.1", "::1", "ip6-localhost"})


# -- start-up (pure decisions) -------------------------------------------------------------
def rendezvous_host(run: RunView, hostname: str) -> str:
    """The address the other instances use to reach instance 0's store.

    All instances on one host: loopback. Otherwise the host poprun placed instance 0 on
    (the name the user gave in ``--host``, which poprun itself reached), or, under a plain
    ``mpirun``, this machine's host name.
    """
    if run.num_local_instances == run.num_instances:
        return "127.0.0.1"
    if run.host.lower() not in _LOOPBACK:
        return run.host
    return hostname


def process_group_backend(every_instance_has_gpu: bool) -> str:
    """gloo alone on CPU; NCCL for CUDA tensors (gloo for CPU ones) when all have a GPU."""
    return "cpu:gloo,cuda:nccl" if every_instance_has_gpu else "gloo"


def build_info() -> dict[str, Any]:
    """torch's version, its torch.distributed backends and the GPUs it sees."""
    import torch.distributed as dist

    available = dist.is_available()
    return {
        "version": torch.__version__,
        "distributed": available,
        "gloo": available and dist.is_gloo_available(),
        "mpi": available and dist.is_mpi_available(),
        "nccl": available and dist.is_nccl_available(),
        "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }


def unavailable() -> str | None:
    """Why this interpreter cannot run the torch backend (``None``: it can)."""
    import torch.distributed as dist

    if not dist.is_available():
        return f"this torch ({torch.__version__}) was built without torch.distributed"
    if read_run().num_instances > 1:
        try:
            import mpi4py.MPI  # noqa: F401 - instance 0's address travels over MPI
        except ImportError as exc:
            return f"mpi4py does not import ({exc})"
    return None


def device_index(run: RunView, device_count: int) -> int:
    """Which visible GPU this instance uses (``device_count`` > 0).

    Under poprun each instance sees only its own devices (``CUDA_VISIBLE_DEVICES``): the
    first. Under a plain ``mpirun`` every rank of a host sees them all: its local rank's.
    """
    if device_count < 1:
        raise CollectiveError(f"device_index: device_count={device_count} must be at least 1")
    return 0 if run.from_poprun else run.local_instance_index % device_count


def _start(run: RunView) -> str:
    """Initialise ``torch.distributed`` for this run; returns the process group's backend."""
    import datetime

    import torch.distributed as dist

    if not dist.is_available():
        raise CollectiveError(
            f"the torch backend needs torch.distributed, which this torch ({torch.__version__}) "
            f"lacks; use --backend horovod or a torch built with it"
        )
    timeout = datetime.timedelta(seconds=read_torch_timeout())
    has_gpu = not run.offline_mode and torch.cuda.is_available()
    store: Any
    if run.num_instances == 1:
        store = dist.HashStore()  # type: ignore[attr-defined]
    else:
        store, has_gpu = _rendezvous(run, has_gpu, timeout)
    backend = process_group_backend(has_gpu)
    if has_gpu:
        torch.cuda.set_device(device_index(run, torch.cuda.device_count()))
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=run.instance_index,
        world_size=run.num_instances,
        timeout=timeout,
    )
    return backend


def _rendezvous(run: RunView, has_gpu: bool, timeout: Any) -> tuple[Any, bool]:
    """Instance 0's store, reached by all; and whether every instance has a GPU."""
    import socket

    import torch.distributed as dist

    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise CollectiveError(
            f"the torch backend with {run.num_instances} instances needs mpi4py to find "
            f"instance 0 ({exc}); install it into {sys.executable}'s environment"
        ) from None
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    if (size, rank) != (run.num_instances, run.instance_index):
        raise world_mismatch("MPI", rank, size, run)
    address: tuple[str, int] | None = None
    master = None
    if rank == 0:
        # Port 0: the kernel picks a free port when it binds, so there is nothing to race.
        master = dist.TCPStore(  # type: ignore[attr-defined]
            "0.0.0.0", 0, size, is_master=True, timeout=timeout, wait_for_workers=False
        )
        address = (rendezvous_host(run, socket.gethostname()), int(master.port))
    address = comm.bcast(address, root=0)
    every_gpu = bool(comm.allreduce(1 if has_gpu else 0, op=MPI.MIN))
    if master is not None:
        return master, every_gpu
    assert address is not None
    host, port = address
    store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)  # type: ignore[attr-defined]
    return store, every_gpu


# -- fusion ----------------------------------------------------------------------------------
class _Bucket:
    """Tensors reduced together: one flat ``all_reduce`` (or the tensor itself, alone)."""

    def __init__(self, key: tuple[torch.dtype, torch.device, bool]) -> None:
        self.key = key
        self.tensors: list[torch.Tensor] = []
        self.nbytes = 0
        self.work: Any = None
        self.flat: torch.Tensor | None = None
        self.done = False

    def add(self, tensor: torch.Tensor) -> None:
        self.tensors.append(tensor)
        self.nbytes += tensor.numel() * tensor.element_size()

    def launch(self, lane: MpiLane | None, *, wake: bool = True) -> None:
        if len(self.tensors) == 1 and self.tensors[0].is_contiguous():
            target = self.tensors[0]
        else:
            self.flat = torch.cat([t.reshape(-1) for t in self.tensors])
            target = self.flat
        if lane is not None and lane.takes(target):
            self.work = lane.submit(target, wake=wake)
        else:
            import torch.distributed as dist

            self.work = dist.all_reduce(target, async_op=True)

    def complete(self, size: int) -> None:
        if self.done:
            return
        self.work.wait()
        average = self.key[2]
        if self.flat is not None:
            if average:
                _divide(self.flat, size)
            offset = 0
            for tensor in self.tensors:
                n = tensor.numel()
                tensor.copy_(self.flat[offset : offset + n].view_as(tensor))
                offset += n
        elif average:
            _divide(self.tensors[0], size)
        self.done, self.flat, self.tensors = True, None, []


def _divide(tensor: torch.Tensor, size: int) -> None:
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.div_(size)
    else:
        tensor.div_(size, rounding_mode="floor")


class _WaitedNext:
    """The block of :meth:`TorchCollectives.waited_next` (it nests): a small object, not a
    generator, as it runs between the backward pass and the last allreduce of every update."""

    __slots__ = ("depth",)

    def __init__(self) -> None:
        self.depth = 0

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1


class TorchCollectives(Collectives):
    """:class:`Collectives` on ``torch.distributed``: gloo, or NCCL on GPUs; fused buckets."""

    name = "torch"
    label = "torch.distributed"

    def __init__(
        self, bucket_bytes: int = BUCKET_BYTES, first_bucket_bytes: int = FIRST_BUCKET_BYTES
    ) -> None:
        self._backend: str | None = None
        self._bucket_bytes = bucket_bytes
        self._first_bucket_bytes = min(first_bucket_bytes, bucket_bytes)
        self._launched_since_wait = False
        self._open: _Bucket | None = None
        self._size = 1
        self._lane: MpiLane | None = None
        self._waited_next = _WaitedNext()  # inside it, the waiter runs the work

    @property
    def process_group_backend(self) -> str | None:
        """``gloo`` or ``cpu:gloo,cuda:nccl`` once started, else ``None``."""
        return self._backend

    @property
    def cpu_allreduce(self) -> str:
        """What reduces CPU gradient buckets: ``mpi`` (the lane) or ``gloo``."""
        return "mpi" if self._lane is not None else "gloo"

    def start(self) -> None:
        """Initialise torch.distributed, or join the default group someone else started."""
        if self.is_started():
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self._backend = str(dist.get_backend())
        else:
            self._backend = _start(read_run())
        self._size = self.size()
        if self._size > 1 and read_torch_cpu_allreduce() == "mpi":
            self._lane = MpiLane.for_world()

    def is_started(self) -> bool:
        dist = sys.modules.get("torch.distributed")
        return (
            self._backend is not None
            and dist is not None
            and dist.is_available()
            and dist.is_initialized()
        )

    def shutdown(self) -> None:
        started = self.is_started()
        self._backend, self._open = None, None
        lane, self._lane = self._lane, None
        if lane is not None:
            lane.close()
        if started:
            import torch.distributed as dist

            dist.destroy_process_group()

    def rank(self) -> int:
        import torch.distributed as dist

        return int(dist.get_rank())

    def size(self) -> int:
        import torch.distributed as dist

        return int(dist.get_world_size())

    # -- fused allreduce -----------------------------------------------------------------
    def allreduce_async_(
        self, tensor: torch.Tensor, *, average: bool = False, name: str | None = None
    ) -> Handle:
        key = (tensor.dtype, tensor.device, average)
        nbytes = tensor.numel() * tensor.element_size()
        cap = self._bucket_bytes if self._launched_since_wait else self._first_bucket_bytes
        bucket = self._open
        if bucket is not None and (bucket.key != key or bucket.nbytes + nbytes > cap):
            self._flush()
            bucket = None
            cap = self._bucket_bytes
        if bucket is None:
            bucket = self._open = _Bucket(key)
        bucket.add(tensor)
        if bucket.nbytes >= cap:
            self._flush()
        return bucket

    def waited_next(self) -> contextlib.AbstractContextManager[None]:
        """Buckets launched in the block do not wake the MPI lane's thread: the waiter runs
        them itself when it can (:meth:`~popdist.collectives.mpilane.MpiLane.run_here`)."""
        return self._waited_next

    def _flush(self) -> None:
        bucket, self._open = self._open, None
        if bucket is not None:
            bucket.launch(self._lane, wake=not self._waited_next.depth)
            self._launched_since_wait = True

    def wait(self, handle: Handle) -> None:
        if not isinstance(handle, _Bucket):
            raise CollectiveError(f"wait({handle!r}): not a handle of the torch backend")
        if handle.work is None:
            with self.waited_next():  # the open bucket: launched here, waited for at once
                self._flush()
        handle.complete(self._size)
        self._launched_since_wait = False  # the next allreduce starts a new pass

    # -- the rest --------------------------------------------------------------------------
    def broadcast_(
        self, tensor: torch.Tensor, *, root: int = 0, name: str | None = None
    ) -> torch.Tensor:
        import torch.distributed as dist

        self._flush()
        dist.broadcast(tensor, src=root)
        return tensor

    def allgather(self, tensor: torch.Tensor, *, name: str | None = None) -> torch.Tensor:
        import torch.distributed as dist

        self._flush()
        every = [torch.empty_like(tensor) for _ in range(self._size)]
        dist.all_gather(every, tensor.contiguous())
        return torch.cat(every)

    def barrier(self) -> None:
        # A tiny allreduce on the CPU group: a NCCL barrier would need to know the device.
        self._flush()
        self.allreduce_(torch.zeros(1))

    def broadcast_tensors(
        self, named: Iterable[tuple[str, torch.Tensor]], *, root: int = 0
    ) -> None:
        """One broadcast per dtype and device: the tensors packed flat, then unpacked."""
        import torch.distributed as dist

        self._flush()
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for _, tensor in named:
            groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
        for tensors in groups.values():
            flat = torch.cat([t.reshape(-1) for t in tensors])
            dist.broadcast(flat, src=root)
            offset = 0
            for tensor in tensors:
                n = tensor.numel()
                tensor.copy_(flat[offset : offset + n].view_as(tensor))
                offset += n
