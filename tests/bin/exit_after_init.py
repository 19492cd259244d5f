"""Every instance starts Horovod (popdist.init) and meets the others in one allreduce; then
instance ``argv[1]`` exits with code ``argv[2]`` (no exception) and the others sleep."""

import sys
import time

import popdist

popdist.init()

import horovod.torch as hvd  # noqa: E402 - after init, as a PopDist script does
import torch  # noqa: E402

hvd.allreduce(torch.ones(1), name="everyone-started")
print(f"instance {popdist.getInstanceIndex()} started", flush=True)
if popdist.getInstanceIndex() == int(sys.argv[1]):
    sys.exit(int(sys.argv[2]))
time.sleep(60)
