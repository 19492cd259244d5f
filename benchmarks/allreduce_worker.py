"""One backend's allreduce timings, run as N poprun instances by ``benchmarks/allreduce.py``.

Each rank times ``reps`` in-place float32 sum-allreduces per size after a warm-up; rank 0
prints one JSON line per size with the slowest rank's median time (a collective ends when its
last rank does). Backends: ``horovod`` (the executor's gradient path: ``popdist_torch``'s
``GradientReducer`` over one parameter of the given size), ``torch`` (the same path on the
torch.distributed backend; launched with ``poprun --backend torch``), ``mpi4py`` (raw ``MPI.Allreduce`` on
a buffer from torch's allocator, the memory gradients live in), ``mpi4py-numpy`` (the same on a
numpy array: numpy advises the kernel to back large arrays with 2 MB pages, torch does not
unless ``THP_MEM_ALLOC_ENABLE=1``), ``gloo`` (``torch.distributed``), and ``memory`` (numpy
``c = a + b`` in one process while the others wait: the memory-bandwidth reference).

With ``--turns DIR`` the job takes turns with other jobs launched beside it
(``benchmarks/_turns.py``): each size is timed in ``--blocks`` blocks, a block only when the
coordinator hands this job its turn, and everything else a rank does (building the next
size's buffers, finding the slowest rank, starting up, exiting) happens inside a turn or
before the first one, so one job's work never lands in another's timed block. Each line then
also carries the slowest rank's median of every block.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def _reps(nbytes: int) -> int:
    # At least 20 calls even at 256 MB: on 2 shared cores single calls vary by 2x and more.
    return max(20, min(200, (256 << 20) // max(nbytes, 1)))


def _time(fn: Callable[[], None], reps: int, barrier: Callable[[], None]) -> float:
    fn()  # warm-up: buffers allocated, connections up
    samples = []
    for _ in range(reps):
        barrier()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


class Turns:
    """This rank's side of ``benchmarks/_turns.py``: it reads a byte from ``go.RANK`` to
    start a turn and writes one to ``done`` when the turn (or, at first, start-up) is over."""

    def __init__(self, directory: str, rank: int) -> None:
        # Held for the life of the process: a turn is a read and a write on them.
        self._go = open(os.path.join(directory, f"go.{rank}"), "rb", buffering=0)  # noqa: SIM115
        self._done = open(os.path.join(directory, "done"), "wb", buffering=0)  # noqa: SIM115
        self.end()  # started up: the coordinator hands out no turn before every rank is here

    def begin(self) -> None:
        if self._go.read(1) != b"g":  # the coordinator is gone
            raise SystemExit("allreduce_worker: the turns' coordinator went away")

    def end(self) -> None:
        self._done.write(b"d")


def _blocks(
    make: Callable[[int], Callable[[], None]],
    sizes: list[int],
    blocks: int,
    turns: Turns,
    comm: Any,
) -> dict[int, list[float]]:
    """Per size, the slowest rank's median of each of ``blocks`` blocks, one block a turn."""
    got: dict[int, list[float]] = {}
    fn: Callable[[], None] | None = None
    for n in sizes:
        per_block = max(4, -(-_reps(n) // blocks))  # about as many calls as without turns
        local = []
        for b in range(blocks):
            turns.begin()
            if b == 0:
                fn = None  # the previous size's buffers are freed in this job's turn
                fn = make(n)
            assert fn is not None
            local.append(_time(fn, per_block, comm.Barrier))
            if b == blocks - 1:  # a collective ends when its last rank does
                got[n] = [max(each) for each in zip(*comm.allgather(local), strict=True)]
            turns.end()
    return got


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--backend",
        required=True,
        choices=["horovod", "torch", "mpi4py", "mpi4py-numpy", "gloo", "memory"],
    )
    parser.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    parser.add_argument("--turns", help="take turns with other jobs (benchmarks/_turns.py)")
    parser.add_argument("--blocks", type=int, default=5, help="blocks per size, with --turns")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    barrier = comm.Barrier

    run: Callable[[int], Callable[[], None]]
    if args.backend in ("mpi4py", "mpi4py-numpy"):
        import torch

        def run(n: int) -> Callable[[], None]:
            if args.backend == "mpi4py":
                buf = torch.ones(n // 4, dtype=torch.float32).numpy()  # torch's memory
            else:
                buf = np.ones(n // 4, dtype=np.float32)
            return lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    elif args.backend == "memory":

        def run(n: int) -> Callable[[], None]:
            a = np.ones(n // 4, dtype=np.float32)
            b = np.ones_like(a)
            c = np.empty_like(a)
            return (lambda: np.add(a, b, out=c)) if rank == 0 else (lambda: None)

    elif args.backend in ("horovod", "torch"):
        import torch

        from popdist_torch.execution.reducer import GradientReducer, connect

        backend = connect(size, rank)  # what trainingModel does: popdist.init()
        if backend.name != args.backend:
            raise SystemExit(f"asked for {args.backend} but poprun started {backend.name}")

        def run(n: int) -> Callable[[], None]:
            # One parameter of n bytes, its gradient reduced by the executor's reducer:
            # the same allreduce_async_/synchronize calls as in one weight update.
            param = torch.nn.Parameter(torch.ones(n // 4, dtype=torch.float32))
            param.grad = torch.ones_like(param)
            reducer = GradientReducer(backend, [("w", param)], average=False)
            return reducer.reduce_all

    else:  # gloo
        import torch
        import torch.distributed as dist

        port = comm.bcast(_free_port() if rank == 0 else None, root=0)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=size)

        def run(n: int) -> Callable[[], None]:
            t = torch.ones(n // 4, dtype=torch.float32)
            return lambda: dist.all_reduce(t)

    if args.turns:
        turns = Turns(args.turns, rank)
        blocks = _blocks(run, sizes, args.blocks, turns, comm)
        turns.begin()  # the last turn: report and exit while no other job is timed
    for n in sizes:
        if args.turns:
            slowest = statistics.median(blocks[n])
        else:
            local = _time(run(n), _reps(n), barrier)
            slowest = comm.allreduce(local, op=MPI.MAX)
            if args.backend == "memory":
                slowest = comm.bcast(local, root=0)
        if rank == 0:
            line = {"backend": args.backend, "bytes": n, "seconds": slowest, "ranks": size}
            if args.turns:
                line["blocks"] = blocks[n]
            print(json.dumps(line), flush=True)
    if args.backend == "gloo":
        import torch.distributed as dist

        dist.destroy_process_group()  # before MPI_Finalize, or gloo's threads abort the exit


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
