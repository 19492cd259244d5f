"""A PopDist script whose instance 1 raises while the others wait in an allreduce.

``import popdist`` under poprun installs the error-record hook, so both the failing
instance and the ones Horovod then shuts down write a record.
"""

import popdist

popdist.init()

import horovod.torch as hvd  # noqa: E402 - after init, as a PopDist script does
import torch  # noqa: E402

if popdist.getInstanceIndex() == 1:
    raise RuntimeError("instance 1 fails inside the training step")
hvd.allreduce(torch.ones(4), name="never-completes")
