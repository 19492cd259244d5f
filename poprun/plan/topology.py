"""The run's topology (pure): hosts → instances → replicas → devices, and NUMA placement."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from popdist.env import split_replicas
from poprun.config.run_config import RunConfig
from poprun.plan.engines.allocation import JobAllocation

LOCALHOST = "localhost"


class InstancePlan(NamedTuple):
    """Where one instance runs and what it owns."""

    index: int  # type: ignore[assignment]  # a field, not tuple.index
    host: str
    local_index: int
    num_local_instances: int
    replica_offset: int
    num_local_replicas: int
    ipus_per_replica: int
    numa_nodes: tuple[int, ...] = ()

    @property
    def replicas(self) -> range:
        """Global indices of this instance's replicas."""
        return range(self.replica_offset, self.replica_offset + self.num_local_replicas)

    @property
    def devices(self) -> range:
        """Global indices of this instance's devices (replica r owns r*ipr ... (r+1)*ipr-1)."""
        first = self.replica_offset * self.ipus_per_replica
        return range(first, first + self.num_local_replicas * self.ipus_per_replica)


class Topology(NamedTuple):
    """Every instance's plan, in instance order."""

    hosts: tuple[str, ...]
    instances: tuple[InstancePlan, ...]
    explicit_hosts: bool
    #: The engine's job the run is in (None outside one): how mpirun launches is its data.
    allocation: JobAllocation | None = None


def spread_numa(local_index: int, num_local: int, num_nodes: int) -> tuple[int, ...]:
    """This instance's share of ``num_nodes`` NUMA nodes (contiguous blocks; shared if fewer nodes)."""
    if num_nodes <= 1:
        return ()
    if num_local <= num_nodes:
        first = local_index * num_nodes // num_local
        last = (local_index + 1) * num_nodes // num_local
        return tuple(range(first, last))
    return (local_index * num_nodes // num_local,)


def plan(config: RunConfig, numa_nodes: Mapping[str, int] | None = None) -> Topology:
    """Place instances host by host, as many on each as the host source decided
    (``config.host_counts``: even for listed hosts, a Slurm job's tasks per node); replicas
    contiguously.

    ``numa_nodes`` gives each host's NUMA node count (missing: one node, nothing to bind).
    """
    hosts = config.hosts or (LOCALHOST,)
    counts = config.host_counts or (config.num_instances // len(hosts),) * len(hosts)
    placed = [
        (host, count, local)
        for host, count in zip(hosts, counts, strict=True)
        for local in range(count)
    ]
    split = split_replicas(config.num_replicas, len(placed))
    instances = []
    offset = 0
    for index, (host, per_host, local_index) in enumerate(placed):
        nodes = (numa_nodes or {}).get(host, 1)
        numa = (
            spread_numa(local_index, per_host, nodes)
            if config.process_placement == "spreadnuma"
            else ()
        )
        instances.append(
            InstancePlan(
                index=index,
                host=host,
                local_index=local_index,
                num_local_instances=per_host,
                replica_offset=offset,
                num_local_replicas=split[index],
                ipus_per_replica=config.ipus_per_replica,
                numa_nodes=numa,
            )
        )
        offset += split[index]
    return Topology(
        hosts=hosts,
        instances=tuple(instances),
        explicit_hosts=bool(config.hosts),
        allocation=config.allocation,
    )


def on_hosts(config: RunConfig, hosts: tuple[str, ...]) -> RunConfig:
    """The run on ``hosts`` only (hosts lost, :mod:`poprun.run.membership`): the same
    replicas, the same instances on each host kept, so more replicas on each instance."""
    counts = config.host_counts or (config.num_instances // len(config.hosts),) * len(config.hosts)
    kept = tuple(n for host, n in zip(config.hosts, counts, strict=True) if host in hosts)
    return config._replace(hosts=hosts, host_counts=kept, num_instances=sum(kept))


def local_numa_node_count() -> int:
    """NUMA nodes with CPUs on this machine (1 when the kernel does not say)."""
    try:
        names = os.listdir("/sys/devices/system/node")
    except OSError:
        return 1
    nodes = [n for n in names if n.startswith("node") and n[4:].isdigit()]
    count = 0
    for node in nodes:
        try:
            with open(f"/sys/devices/system/node/{node}/cpulist") as handle:
                if handle.read().strip():
                    count += 1
        except OSError:
            continue
    return max(count, 1)


def _ranges(values: range | tuple[int, ...]) -> str:
    items = list(values)
    if not items:
        return "-"
    if len(items) == 1:
        return str(items[0])
    return f"{items[0]}-{items[-1]}"


def render(topology: Topology) -> str:
    """A table of hosts, instances, replicas and devices for ``--print-topology``: a row per
    instance, or past :data:`poprun.summary.THRESHOLD` instances a row per run of alike hosts."""
    from poprun import summary  # (--print-topology only)

    header: tuple[str, ...] = ("host", "instance", "local", "replicas", "devices", "numa")
    if summary.summarised(len(topology.instances)):
        header, rows = (
            ("hosts", "instances", "a host", "replicas", "devices", "numa"),
            [*_host_rows(topology)],
        )
    else:
        rows = [
            (
                plan.host,
                str(plan.index),
                str(plan.local_index),
                _ranges(plan.replicas),
                _ranges(plan.devices),
                ",".join(map(str, plan.numa_nodes)) or "-",
            )
            for plan in topology.instances
        ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def fmt(row: tuple[str, ...]) -> str:
        return "| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |"

    first = topology.instances[0]
    total = sum(plan.num_local_replicas for plan in topology.instances)
    title = (
        f"poprun topology: {len(topology.hosts)} host(s), {len(topology.instances)} instance(s), "
        f"{total} replica(s), {first.ipus_per_replica} device(s) per replica"
    )
    lines = [title, line, fmt(header), line, *map(fmt, rows), line]
    if topology.allocation is not None:
        lines.insert(1, topology.allocation.render())
    return "\n".join(lines)


def _host_rows(topology: Topology) -> list[tuple[str, ...]]:
    """One row per run of consecutive hosts alike (instances, local replicas, NUMA nodes of
    each local instance); past :data:`poprun.summary.TOP` rows, the rest as one."""
    from poprun import summary

    runs: list[tuple[tuple[object, ...], list[InstancePlan]]] = []
    host = None
    for plan in topology.instances:
        if plan.host != host:
            host, group = plan.host, [plan]
            shape: list[object] = [plan.num_local_instances]
            runs.append(((), group))
        else:
            group.append(plan)
        shape.append((plan.num_local_replicas, plan.numa_nodes))
        if plan.local_index == plan.num_local_instances - 1:
            key = tuple(shape)
            if len(runs) > 1 and runs[-2][0] == key:
                runs[-2][1].extend(runs.pop()[1])
            else:
                runs[-1] = (key, group)
    rows = [_row(group) for _, group in runs[: summary.TOP]]
    if len(runs) > summary.TOP:
        rows.append(_row([p for _, group in runs[summary.TOP :] for p in group], more=True))
    return rows


def _row(group: list[InstancePlan], *, more: bool = False) -> tuple[str, ...]:
    from poprun import summary

    names = [p.host for p in group]
    hosts = summary.hosts(names, most=3)
    if more:
        hosts = f"… {summary.count(len(dict.fromkeys(names)), 'more host')}: {hosts}"
    per_host = sorted({p.num_local_instances for p in group})
    replicas = sorted({p.num_local_replicas for p in group})
    each = "-".join(map(str, (replicas[0], replicas[-1]) if len(replicas) > 1 else replicas))
    numa = sorted({n for p in group for n in p.numa_nodes})
    return (
        hosts,
        summary.ranges(p.index for p in group),
        "-".join(map(str, (per_host[0], per_host[-1]) if len(per_host) > 1 else per_host)),
        f"{_ranges(range(group[0].replicas.start, group[-1].replicas.stop))} ({each} each)",
        _ranges(range(group[0].devices.start, group[-1].devices.stop)),
        summary.ranges(numa) if numa else "-",
    )
