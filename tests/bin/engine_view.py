"""Write what this instance sees under a cluster engine to DIR/<instance>.json.

Usage: engine_view.py DIR [NAME ...]. The instance's host, its PopDist view, the variables
NAME (None where unset), the names of the processes it descends from (``sge_shepherd``
under Grid Engine's ``qrsh -inherit``; ``sshd`` when it came over ssh) and its
supplementary groups (Grid Engine tags a job's processes with one of its own).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import popdist


def ancestors() -> list[str]:
    """The command names of this process's parents, nearest first, up to pid 1."""
    names, pid = [], os.getppid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        names.append(stat[stat.index("(") + 1 : stat.rindex(")")])
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return names


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    view = {
        "host": socket.gethostname(),
        "instance": popdist.getInstanceIndex(),
        "instances": popdist.getNumInstances(),
        "local_instance": popdist.getLocalInstanceIndex(),
        "local_instances": int(os.environ.get("POPDIST_NUM_LOCAL_INSTANCES", "0")),
        "replicas": popdist.getNumTotalReplicas(),
        "local_replicas": popdist.getNumLocalReplicas(),
        "env": {name: os.environ.get(name) for name in names},
        "popdist": {k: v for k, v in os.environ.items() if k.startswith("POPDIST_")},
        "ancestors": ancestors(),
        "groups": sorted(os.getgroups()),
    }
    print(f"instance {view['instance']} on {view['host']}", flush=True)
    (out / f"{view['instance']}.json").write_text(json.dumps(view))


if __name__ == "__main__":
    main()
