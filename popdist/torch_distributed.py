"""The second collective backend: ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Started by ``popdist.init(backend="torch")`` (or ``poprun --backend torch``, which exports
``POPDIST_BACKEND=torch``). Rank and size are the instance index and count popdist reads
from the environment; no ``MASTER_ADDR``/``MASTER_PORT`` is needed. Instance 0 opens a
``TCPStore`` on a port the kernel picks (port 0, so two jobs on one host never collide and
nothing races between choosing a port and binding it) and sends its address to the other
instances over the MPI job poprun started (``mpi4py`` broadcast, as Lightning's
``MPIEnvironment`` does); the store then carries ``torch.distributed``'s own rendezvous.
A single instance needs no MPI at all: an in-memory store.

The process group is gloo when any instance has no GPU (or ``--offline-mode``), and
``cpu:gloo,cuda:nccl`` when every instance has one: CUDA tensors go over NCCL, the few CPU
tensors popdist itself exchanges (``execute_on_instances``' flags) over gloo. Every
instance must pick the same, so the choice is agreed over MPI (a minimum of "has a GPU").

Horovod is never imported here. torch and mpi4py are imported only when :func:`start` runs.
"""

from __future__ import annotations

import os
import sys

from popdist.env import PopdistError, RunView

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "device_index",
    "is_initialized",
    "process_group_backend",
    "rendezvous_host",
    "start",
    "stop",
]

#: How long instances wait for each other at start-up and in a collective, in seconds,
#: unless ``POPDIST_TORCH_TIMEOUT`` says otherwise (torch's own default is 30 minutes).
DEFAULT_TIMEOUT_S = 600.0
TIMEOUT_VARIABLE = "POPDIST_TORCH_TIMEOUT"

_LOOPBACK = frozenset({"", "localhost", "127.0.0.1", "::1", "ip6-localhost"})


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


def device_index(run: RunView, device_count: int) -> int:
    """Which visible GPU this instance uses (``device_count`` > 0).

    Under poprun each instance sees only its own devices (``CUDA_VISIBLE_DEVICES``): the
    first. Under a plain ``mpirun`` every rank of a host sees them all: its local rank's.
    """
    if device_count < 1:
        raise PopdistError(f"device_index: device_count={device_count} must be at least 1")
    return 0 if run.from_poprun else run.local_instance_index % device_count


def _timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_VARIABLE, "")
    if not raw.strip():
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise PopdistError(
            f"{TIMEOUT_VARIABLE}={raw!r} must be a positive number of seconds; unset it for "
            f"the default ({DEFAULT_TIMEOUT_S:g})"
        )
    return value


def _has_gpu(run: RunView) -> bool:
    import torch

    return not run.offline_mode and torch.cuda.is_available()


def start(run: RunView) -> str:
    """Initialise ``torch.distributed`` for this run; returns the process group's backend."""
    import datetime

    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise PopdistError(
            f"popdist.init(backend='torch') needs torch.distributed, which this torch "
            f"({torch.__version__}) lacks; use backend 'horovod' or a torch built with it"
        )
    timeout = datetime.timedelta(seconds=_timeout_s())
    has_gpu = _has_gpu(run)
    store: Any
    if run.num_instances == 1:
        store = dist.HashStore()
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
        raise PopdistError(
            f"popdist.init(backend='torch') with {run.num_instances} instances needs mpi4py "
            f"to find instance 0 ({exc}); install it into {sys.executable}'s environment"
        ) from None
    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    if (size, rank) != (run.num_instances, run.instance_index):
        where = "poprun's POPDIST_*" if run.from_poprun else "the environment"
        raise PopdistError(
            f"MPI sees rank {rank} of {size} processes but {where} says instance "
            f"{run.instance_index} of {run.num_instances}: start every instance from one "
            f"poprun (or mpirun) command and do not mix launchers"
        )
    address: tuple[str, int] | None = None
    master = None
    if rank == 0:
        # Port 0: the kernel picks a free port at bind time, so there is nothing to race.
        master = dist.TCPStore(
            "0.0.0.0", 0, size, is_master=True, timeout=timeout, wait_for_workers=False
        )
        address = (rendezvous_host(run, socket.gethostname()), int(master.port))
    address = comm.bcast(address, root=0)
    every_gpu = bool(comm.allreduce(1 if has_gpu else 0, op=MPI.MIN))
    assert address is not None
    if master is not None:
        return master, every_gpu
    host, port = address
    return dist.TCPStore(host, port, size, is_master=False, timeout=timeout), every_gpu


def is_initialized() -> bool:
    """Whether this process has a default ``torch.distributed`` process group."""
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def stop() -> None:
    """Destroy the default process group (idempotent)."""
    if is_initialized():
        import torch.distributed as dist

        dist.destroy_process_group()
