"""Where a DataLoader's data order stands, for checkpoints: the topology it depends on, and
how a position saved on one topology maps onto another.

A position is (epoch, batch); which samples batch ``b`` of an epoch holds depends on the
topology (processes, replicas, batch sizes) and the order. :func:`topology_record` is what a
checkpoint keeps of it; :func:`resume_batch` maps a saved batch onto this loader's topology,
or refuses when resuming would skip or repeat samples.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from popdist_torch.data.plan import ORDER_TOPOLOGY_INVARIANT, LoaderPlan
from popdist_torch.errors import DataLoaderError

__all__ = ["resume_batch", "topology_record"]


def topology_record(plan: LoaderPlan) -> dict[str, Any]:
    """What decides which samples a combined batch holds: resuming needs the same."""
    di, local, ga = plan.topology
    counts = plan.replica_counts if plan.auto else None
    return {
        "processes": plan.processes,
        "local_replicas": local,
        "replicas": sum(counts) if counts else local * plan.processes,
        "device_iterations": di,
        "gradient_accumulation": ga,
        "batch_size": plan.batch_size,
        "combined": plan.combined,
        "num_samples": plan.num_samples,
        "order": plan.order,
        "shuffle": plan.shuffle,
        "drop_last": plan.drop_last,
    }


def _global_step(t: Mapping[str, Any]) -> int:
    """Samples of one global step over all processes (their combined batches may differ)."""
    if t.get("replicas") and t.get("batch_size"):
        return (
            int(t["batch_size"])
            * int(t["device_iterations"])
            * int(t["gradient_accumulation"])
            * int(t["replicas"])
        )
    return int(t["combined"]) * int(t["processes"])


def _describe(t: Mapping[str, Any]) -> str:
    return (
        f"{t['processes']} process(es) × {t['local_replicas']} local replica(s), "
        f"combined batch {t['combined']}, {t['order']} order"
    )


def resume_batch(saved: Mapping[str, Any], current: Mapping[str, Any], batch: int) -> int:
    """``batch`` (saved on topology ``saved``) as a batch index of topology ``current``.

    The same topology, or the start of an epoch: unchanged. The topology-invariant order
    with a step boundary in common: the batch that starts at the same sample. Otherwise
    resuming would skip or repeat samples: refused, with what to do.
    """
    # A record from before "replicas" was kept is the same topology without it.
    if batch == 0 or dict(saved) == {k: v for k, v in current.items() if k in saved}:
        return batch
    same_data = all(
        saved.get(key) == current[key] for key in ("num_samples", "shuffle", "drop_last")
    )
    if same_data and saved.get("order") == current["order"] == ORDER_TOPOLOGY_INVARIANT:
        old_step, new_step = _global_step(saved), _global_step(current)
        n = int(current["num_samples"])
        shift_same = not current["shuffle"] or n % old_step == n % new_step
        consumed = batch * old_step
        if shift_same and consumed % new_step == 0:
            return consumed // new_step
    raise DataLoaderError(
        f"DataLoader state was saved mid-epoch (batch {batch}) with {_describe(saved)}; "
        f"this DataLoader has {_describe(current)}: resuming would skip or repeat samples. "
        "Resume with the same topology, save at the end of an epoch, or use "
        "order='topology_invariant' with global steps that divide each other"
    )
