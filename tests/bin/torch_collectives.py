"""Child of tests/parallel/test_torch_collectives.py: the torch backend's collectives, 2 ranks.

Small buckets (64 bytes) so that packing, flushing on a dtype change, a tensor larger than a
bucket (reduced in place), non-contiguous tensors and averaging all happen; then broadcast,
allgather and barrier. Prints ``OK <rank>`` or ``FAIL <rank>: <what>`` and exits 1.
"""

from __future__ import annotations

import sys

import torch

import popdist
from popdist.collectives.torchdist import TorchCollectives


def main() -> None:
    popdist.init(backend="torch")
    c = TorchCollectives(bucket_bytes=64)
    c.start()
    rank, size = c.rank(), c.size()
    r = float(rank + 1)  # rank 0 holds 1s, rank 1 holds 2s: sum 3, mean 1.5
    tensors = [
        torch.full((3,), r),  # 12 bytes
        torch.full((2, 2), r),  # 16 bytes: same bucket
        torch.full((5,), int(r), dtype=torch.int64),  # dtype change: a new bucket
        torch.full((40,), r),  # 160 bytes: larger than a bucket, reduced in place
        torch.full((4, 4), r).t(),  # non-contiguous
        torch.full((2,), r, dtype=torch.float64),  # each of the lane's MPI types
        torch.full((3,), int(r), dtype=torch.int32),
        torch.full((3,), r, dtype=torch.bfloat16),  # no MPI dtype: gloo even beside the lane
    ]
    handles = [c.allreduce_async_(t) for t in tensors]
    averaged = torch.full((6,), r)
    handles.append(c.allreduce_async_(averaged, average=True))
    for handle in reversed(handles):  # waiting out of order is fine
        c.wait(handle)
    want = [3.0, 3.0, 3, 3.0, 3.0, 3.0, 3, 3.0]
    problems = [
        f"tensor {i}: {t.flatten().tolist()[:3]} != {w}"
        for i, (t, w) in enumerate(zip(tensors, want, strict=True))
        if not bool((t == w).all())
    ]
    if not bool((averaged == 1.5).all()):
        problems.append(f"average: {averaged.tolist()}")
    named = [
        ("a", torch.full((3,), r)),
        ("b", torch.full((2,), int(r))),
        ("c", torch.full((2,), r)),
    ]
    c.broadcast_tensors(named, root=1)
    if not all(bool((t == 2).all()) for _, t in named):
        problems.append(f"broadcast_tensors: {[t.tolist() for _, t in named]}")
    gathered = c.allgather(torch.tensor([[rank, 10 + rank]]))
    if gathered.tolist() != [[0, 10], [1, 11]]:
        problems.append(f"allgather: {gathered.tolist()}")
    c.barrier()
    if size != 2:
        problems.append(f"size {size}")
    print(f"CPU allreduce {rank}: {c.cpu_allreduce}", flush=True)
    c.shutdown()  # stops the MPI lane's thread and frees its communicator
    print(f"FAIL {rank}: {problems}" if problems else f"OK {rank}", flush=True)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
