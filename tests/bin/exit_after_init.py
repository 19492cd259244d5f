"""Every instance starts Horovod (popdist.init) and meets the others in one allreduce; then
instance ``argv[1]`` exits with code ``argv[2]`` at once (no exception) and the others sleep.

The exit is ``os._exit``, mid-run: ``sys.exit`` would run popdist's finaliser at exit, whose
Horovod shutdown waits for every peer to shut down too (here: for their sleep to end), so the
job would end only then, every other instance having exited 0 first.
"""

import os
import sys
import time

import popdist

popdist.init()

import horovod.torch as hvd  # noqa: E402 - after init, as a PopDist script does
import torch  # noqa: E402

hvd.allreduce(torch.ones(1), name="everyone-started")
print(f"instance {popdist.getInstanceIndex()} started", flush=True)
if popdist.getInstanceIndex() == int(sys.argv[1]):
    sys.stderr.flush()
    os._exit(int(sys.argv[2]))
time.sleep(60)
