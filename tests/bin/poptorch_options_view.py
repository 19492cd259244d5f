"""Write what a PopTorch program reads back from its options to DIR/<instance>.json.

Run under poprun: ``Options`` and ``popdist.poptorch.Options`` must answer PopTorch's read
accessors with this instance's values, and ``torch.ops.poptorch`` must be registered in it.
"""

import json
import os
import sys

import torch

import popdist.poptorch
import popdist_torch as poptorch
from popdist_torch import popart

opts = poptorch.Options()
launched = popdist.poptorch.Options()
launched._Popart.set("autoRecomputation", int(popart.RecomputationType.Pipeline))
x = torch.ones(3)
marked = torch.ops.poptorch.set_available_memory(torch.ops.poptorch.nop(x), 0.5)
view = {
    "num_distributed_processes": opts.Distributed.num_distributed_processes,
    "distributed_process_id": opts.Distributed.distributed_process_id,
    "launched_replication_factor": launched.replication_factor,
    "launched_processes": launched.Distributed("num_distributed_processes"),
    "launched_process_id": launched.Distributed.processId,
    "popart_options": launched.toDict()["_Popart"],
    "ops_identity": marked is x,
}
with open(os.path.join(sys.argv[1], f"{view['distributed_process_id']}.json"), "w") as handle:
    json.dump(view, handle)
