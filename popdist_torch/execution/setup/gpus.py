"""The GPUs an instance leaves idle, said in one line at start.

poprun gives an instance ``local replicas × devices per replica`` GPUs
(``CUDA_VISIBLE_DEVICES``); the local replicas share one set of weights, so they compute
on one replica's GPUs: an unstaged model on one GPU (its replicas in one ``vmap``), a
staged one on ``devices per replica`` of them
(:func:`popdist_torch.pipeline.stage_devices`). :func:`idle_gpus_note` is the line an
instance prints when it leaves some of its GPUs idle, with the launch that uses them all
(pure); :func:`announce_idle_gpus` prints it, once per process.
"""

from __future__ import annotations

import sys

from popdist_torch.execution.setup.plan import ExecutorPlan, World
from popdist_torch.options import Options

__all__ = ["announce_idle_gpus", "idle_gpus_note"]


def idle_gpus_note(
    *, visible: int, used: int, local_replicas: int, instances: int, devices_per_replica: int
) -> str | None:
    """The line an instance that computes on ``used`` of its ``visible`` GPUs prints (None
    when it uses them all, or computes on none): how many it uses and the launch that uses
    every GPU, one instance per replica, each on its own ``devices_per_replica`` GPUs: as
    many replicas as the run's ``instances`` (each seeing its own GPUs, as poprun gives
    them) have GPUs for, not the replicas it runs now (one replica would still use one)."""
    if used < 1 or used >= visible:
        return None
    who = f"its {local_replicas} local replicas share " if local_replicas > 1 else ""
    which = "cuda:0" if used == 1 else f"cuda:0-{used - 1}"
    replicas = instances * max(1, visible // devices_per_replica)
    launch = f"poprun --num-instances {replicas} --num-replicas {replicas}"
    each = "one instance per GPU"
    if devices_per_replica > 1:
        launch += f" --ipus-per-replica {devices_per_replica}"
        each = f"one instance per replica, {devices_per_replica} GPUs each"
    return (
        f"popdist_torch: this instance computes on {used} of the {visible} GPUs it sees "
        f"({who}{which}; {visible - used} idle); to use every GPU run {each}: {launch}"
    )


#: The idle-GPU lines this process printed (once each, whatever the models wrapped).
_ANNOUNCED: set[str] = set()


def announce_idle_gpus(plan: ExecutorPlan, world: World, opts: Options) -> None:
    """Say in one line at start that this instance leaves GPUs idle, and how to use them."""
    devices = opts.ipus_per_replica or 1
    if not plan.stage_gpus:
        used = 1 if plan.device.type == "cuda" else 0
    elif opts.ipus_per_replica is not None:
        used = min(devices, plan.stage_gpus)
    else:
        return  # the stages, and so the GPUs they use, are known at the first forward
    note = idle_gpus_note(
        visible=world.visible_gpus,
        used=used,
        local_replicas=opts.replication_factor,
        instances=len(world.replica_counts),
        devices_per_replica=devices,
    )
    if note is not None and note not in _ANNOUNCED:
        _ANNOUNCED.add(note)
        print(note, file=sys.stderr, flush=True)
