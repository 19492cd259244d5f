"""Write this instance's PopDist view to DIR/<instance>.json (stdlib + popdist only)."""

import json
import os
import sys

import popdist
from popdist.env import read_run

view = read_run().as_dict()
getters = (
    "getInstanceIndex",
    "getNumInstances",
    "getReplicaIndexOffset",
    "getNumLocalReplicas",
    "getNumTotalReplicas",
    "getNumIpusPerReplica",
)
for name in getters:
    if hasattr(popdist, name):
        view[name] = getattr(popdist, name)()
view["argv"] = sys.argv[2:]
shown = ("SENTINEL", "PYTHONUNBUFFERED", "BASH_FUNC_f%%", "POPDIST_BACKEND")
view["env"] = {k: os.environ.get(k) for k in shown}
with open(os.path.join(sys.argv[1], f"{view['instance_index']}.json"), "w") as handle:
    json.dump(view, handle)
