"""Print how much of a 16 MiB malloc'ed and written buffer the kernel backs with 2 MB pages.

Under poprun's allocator defaults glibc asks for transparent huge pages for its heap
(``glibc.malloc.hugetlb=1``); under glibc's own defaults it does not.
"""

from __future__ import annotations

import ctypes
import os

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
SIZE = 16 << 20

address = libc.malloc(SIZE)
ctypes.memset(address, 1, SIZE)  # fault every page in
huge_kb, inside = 0, False
with open("/proc/self/smaps") as smaps:
    for line in smaps:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):  # a mapping's first line: start-end ...
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == "AnonHugePages:":
            huge_kb = int(line.split()[1])
print(f"huge_kb={huge_kb} tunables={os.environ.get('GLIBC_TUNABLES', '-')}", flush=True)
