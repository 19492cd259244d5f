"""Whether this host has a fabric: an interconnect Open MPI would pick over TCP.

Open MPI's default selection, in every ``MPI_Init``, first opens the transports that drive a
fabric (the UCX ``pml`` and the ``cm`` ``pml`` with its libfabric and PSM2 ``mtl``s); each
looks for its devices and declines when there are none, and only then does Open MPI settle on
``ob1`` over TCP. On a host without a fabric that search costs about 0.2 s per
``MPI_Init`` and changes nothing, so poprun names ``ob1`` itself there (:mod:`poprun.plan.mpirun`).

The kernel lists the devices those transports use under a few classes: ``infiniband`` holds
every verbs device (InfiniBand, RoCE and iWARP NICs, Omni-Path's ``hfi1``, AWS EFA, Cisco
usNIC), ``cxi`` holds HPE Slingshot's NICs, and ``/dev/kgni0`` is Cray's Aries. Reading
them is a directory listing: no library is loaded and nothing is probed.
"""

from __future__ import annotations

import os

#: Directories whose entries are fabric devices, and device files that are one.
DEVICE_CLASSES = ("/sys/class/infiniband", "/sys/class/cxi")
DEVICE_FILES = ("/dev/kgni0",)


def local_devices(root: str = "/") -> list[str]:
    """The fabric devices this host has (``mlx5_0``, ``efa_0``, ``cxi0``, ...); [] for none.

    ``root`` is where the file system starts (tests point it at a directory of their own).
    """
    found: list[str] = []
    for directory in DEVICE_CLASSES:
        try:
            found += sorted(os.listdir(os.path.join(root, directory.lstrip("/"))))
        except OSError:  # no such class: the driver is not loaded, so no such device
            continue
    for path in DEVICE_FILES:
        if os.path.exists(os.path.join(root, path.lstrip("/"))):
            found.append(os.path.basename(path))
    return found
