"""Which GPUs each instance sees (pure): its slice of ``CUDA_VISIBLE_DEVICES``.

As on IPUs, an instance owns ``local replicas × devices per replica`` devices, and the
instances of one host take consecutive slices: local instance ``k`` gets devices
``k·n … k·n + n − 1`` with ``n = local replicas × devices per replica``. poprun exports
the slice as ``CUDA_VISIBLE_DEVICES`` to each instance, so an instance's first device is
always ``cuda:0``.

The user overrides it by setting ``CUDA_VISIBLE_DEVICES`` for poprun: that list is then the
pool every host's instances slice (``CUDA_VISIBLE_DEVICES=4,5,6,7`` uses the upper half of
a host; ``CUDA_VISIBLE_DEVICES=`` hides every GPU and runs on CPU). Without it the pool is
the device ordinals ``0, 1, 2 …``; a host with fewer GPUs than the slices ask for leaves
the instances past its count without a GPU (CUDA ignores ordinals it does not have), and
they run on CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from poprun.errors import PoprunError
from poprun.plan.topology import InstancePlan, Topology

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def device_pool(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The user's ``CUDA_VISIBLE_DEVICES`` as a list, or ``None`` (all ordinals)."""
    raw = environ.get(VISIBLE_DEVICES)
    if raw is None:
        return None
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def devices_per_instance(plan: InstancePlan) -> int:
    """Devices one instance owns: its local replicas × devices per replica."""
    return plan.num_local_replicas * plan.ipus_per_replica


def instance_devices(plan: InstancePlan, pool: Sequence[str] | None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value of one instance (comma-separated)."""
    n = devices_per_instance(plan)
    first = plan.local_index * n
    if pool is None:
        return ",".join(str(i) for i in range(first, first + n))
    return ",".join(pool[first : first + n])


def check_pool(topology: Topology, pool: Sequence[str] | None) -> None:
    """A user pool must give every instance at least one device (an empty pool: none).

    Raises :class:`PoprunError` naming the value and how many devices the run needs.
    """
    if not pool:
        return
    for plan in topology.instances:
        if plan.local_index * devices_per_instance(plan) >= len(pool):
            need = plan.num_local_instances * devices_per_instance(plan)
            raise PoprunError(
                VISIBLE_DEVICES,
                ",".join(pool),
                f"lists {len(pool)} device(s) but {plan.num_local_instances} instance(s) on "
                f"host {plan.host} take {devices_per_instance(plan)} each ({need} in all), so "
                f"local instance {plan.local_index} would get none",
                f"list at least {need} devices, run fewer instances per host, or unset it to "
                f"let poprun hand out devices 0, 1, 2",
            )


#: Where the NVIDIA driver lists the GPUs of this host (a directory per GPU), read without
#: CUDA (poprun never imports torch).
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


def gpus_here(environ: Mapping[str, str], listing: str = NVIDIA_GPUS) -> int:
    """How many GPUs this host's instances can see: the user's pool, else the driver's list
    (0 where there is no NVIDIA driver)."""
    pool = device_pool(environ)
    if pool is not None:
        return len(pool)
    import os

    try:
        return len(os.listdir(listing))
    except OSError:
        return 0


def idle_gpus_line(topology: Topology, gpus: int) -> str:
    """``--print-topology``'s line when an instance is given more GPUs than popdist_torch's
    executor computes on (its local replicas share one device; a pipelined replica's stages
    use its devices per replica), with the launch that uses them all; "" when none idles
    or this host has no GPU."""
    if gpus <= 0 or not topology.instances:
        return ""
    plan = topology.instances[0]
    given = min(devices_per_instance(plan), gpus)
    used = min(plan.ipus_per_replica, given)
    if given <= used:
        return ""
    replicas = sum(p.num_local_replicas for p in topology.instances)
    per = f", {used} GPUs each" if used > 1 else ""
    each = "replica" if used > 1 else "GPU"
    launch = f"poprun --num-instances {replicas} --num-replicas {replicas}"
    if used > 1:
        launch += f" --ipus-per-replica {used}"
    return (
        f"poprun: each instance computes on {used} of the {given} GPUs it is given (its "
        f"{plan.num_local_replicas} local replicas share them; {given - used} idle); to use "
        f"every GPU run one instance per {each}{per}: {launch}"
    )
