"""Print this instance's page faults per 32 MiB allreduce (raw MPI, in place, after a warm-up).

With Open MPI's own choice the reduction goes through a temporary buffer that glibc maps
afresh on every call (about 4000 faults a call on 2 ranks); with poprun's allreduce rules on
one host it goes in 1 MiB segments whose buffers stay in the heap (about 0).
"""

from __future__ import annotations

import resource

import numpy as np
from mpi4py import MPI

buffer = np.ones(8 << 20, dtype=np.float32)  # 32 MiB
for _ in range(2):
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
print(f"faults_per_allreduce={faults:.0f} sum={buffer[0]:g}", flush=True)
