"""The multi-host tier's namespace hosts: :mod:`tests.support.hosts`, under its old name.

The hosts moved to ``tests/support`` once another tier (Grid Engine's) and the benchmarks
built on them; this module keeps the multi-host tier's imports and the command
``python -m tests.multihost.hosts check | up N`` working.
"""

from __future__ import annotations

import sys

from tests.support.hosts import (
    DOWN,
    PREFIX,
    SUBNET,
    Hosts,
    hosts,
    main,
    netns_pids,
    remove_stale,
    unavailable,
)

__all__ = [
    "DOWN",
    "PREFIX",
    "SUBNET",
    "Hosts",
    "hosts",
    "main",
    "netns_pids",
    "remove_stale",
    "unavailable",
]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
