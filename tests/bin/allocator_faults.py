"""Print this instance's page faults per training-like step (16 x 1 MiB live, then freed).

Under glibc's defaults the freed heap top is trimmed back to the kernel and faulted in again
on every step (about 4000 faults); with poprun's allocator defaults it stays (about 0).
"""

from __future__ import annotations

import ctypes
import os
import resource

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
MIB = 1 << 20


def step() -> None:
    buffers = [libc.malloc(MIB) for _ in range(16)]
    for buffer in buffers:
        ctypes.memset(buffer, 1, MIB)  # touch every page
    for buffer in buffers:
        libc.free(buffer)


for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
trim = os.environ.get("MALLOC_TRIM_THRESHOLD_", "-")
print(f"faults_per_step={faults:.0f} trim={trim}", flush=True)
