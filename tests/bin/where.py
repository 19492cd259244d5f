"""Write what this instance sees to DIR/<instance>.json: its host, PopDist view and env."""

import json
import os
import socket
import sys

import popdist

names = sys.argv[2:]
view = {
    "host": socket.gethostname(),
    "instance": popdist.getInstanceIndex(),
    "instances": popdist.getNumInstances(),
    "local_instance": popdist.getLocalInstanceIndex(),
    "offset": popdist.getReplicaIndexOffset(),
    "local_replicas": popdist.getNumLocalReplicas(),
    "replicas": popdist.getNumTotalReplicas(),
    "env": {name: os.environ.get(name) for name in names},
}
print(f"instance {view['instance']} on {view['host']}")
with open(os.path.join(sys.argv[1], f"{view['instance']}.json"), "w") as handle:
    json.dump(view, handle)
