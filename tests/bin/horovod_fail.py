"""Every instance starts Horovod; instance 1 raises while the others block in an allreduce.

It imports popdist, as a training script does, so under poprun it reports its exception as
a structured record.
"""

import os
import sys

import horovod.torch as hvd
import torch

import popdist  # noqa: F401 - installs the error record hook under poprun

hvd.init()
if hvd.rank() == 1:
    raise RuntimeError("instance 1 fails inside the training step")
hvd.allreduce(torch.ones(4), name="never-completes")
print("allreduce returned", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT_AFTER", "0")))
