"""Instances busy for a long while, their peers waiting: ``busy_instance.py GIL_S EVAL_S``.

At the same time, the last instance evaluates (matrix products) for EVAL_S seconds and the
one before it makes a C call that holds the GIL for GIL_S seconds (``sleep`` through
``ctypes.PyDLL``, which keeps the GIL: its progress and lease threads are stopped too); the
others wait in an allreduce meanwhile. Each prints ``BUSY DONE <instance>`` at the end.
"""

from __future__ import annotations

import ctypes
import sys
import time

import torch

import popdist
from popdist.collectives import lifecycle


def main() -> None:
    gil_s, eval_s = float(sys.argv[1]), float(sys.argv[2])
    popdist.init()
    backend = lifecycle.for_run(popdist.getNumInstances())
    last = popdist.getNumInstances() - 1
    backend.allreduce_(torch.ones(4))
    if popdist.getInstanceIndex() == last - 1:
        ctypes.PyDLL(None).sleep(int(gil_s))  # the GIL held throughout
    if popdist.getInstanceIndex() == last:
        a = torch.randn(128, 128)
        end = time.monotonic() + eval_s
        while time.monotonic() < end:
            a = torch.tanh(a @ a)
    backend.allreduce_(torch.ones(4))
    print(f"BUSY DONE {popdist.getInstanceIndex()}", flush=True)


if __name__ == "__main__":
    main()
