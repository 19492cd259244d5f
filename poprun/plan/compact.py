"""The compact launch plan (pure): an mpirun command of O(hosts) words, whatever the job's size.

Each instance's contract values (``POPDIST_*``, its ``CUDA_VISIBLE_DEVICES`` slice, its NUMA
nodes) are a function of its rank and a plan the size of the host list: the job's numbers
(replicas, devices per replica, instances), the hosts with their instance counts, the user's
device pool and NUMA binding. poprun no longer writes an app context per instance (with every
``-x`` repeated: 1.6 MB of argv at 1,024 instances, past Linux's limit on argv and
environment); it writes one app context per run of consecutive instances that share their
mpirun arguments (:class:`Context`), and the instance wrapper works out its instance's values
from ``OMPI_COMM_WORLD_RANK`` with shell arithmetic (:data:`DERIVE`) before it starts the
program, so a program that never imports popdist reads the same environment as before.

:func:`instance_plan` is that arithmetic in Python (a test runs the shell's against it and
against the per-instance rendering it replaces): rank → host, local index, replicas
(:func:`popdist.env.replica_share`), devices (:mod:`poprun.plan.devices`), NUMA nodes
(:func:`poprun.plan.topology.spread_numa`). Its values are the contract's own
(:func:`poprun.plan.environment.instance_values`, through
:func:`popdist.env.instance_environment`). The values every instance shares
(:data:`JOB_WIDE`) go into the command as ``-x NAME=value``, once a context, so ``--dry-run``
shows them; the wrapper exports the rest.

A context ends where the next instance takes other per-instance mpirun arguments
(``--instance-mpi-local-args``), and before the first instance on poprun's own host. Open MPI
maps a context's processes host by host in ``-H`` order (filling each host's slots), except
that its own host, when listed, always comes first; starting a context there keeps rank
order equal to the plan's. Only a context's first host can then be poprun's, and only its
instances get the local wrapper (FIFOs, the pid line); the others get the remote one (the
exit record). A job on poprun's host alone is one context.

The wrapper's arguments, after its ``$0``: ``"FIRST FIRST_LOCAL EACH LOCAL NUMA"`` (the
context's first rank, that instance's local index on the context's first host, the instances
of each host when all hosts of the context have as many, else 0, whether the first host is
poprun's, and the NUMA nodes to spread over, 0 for no binding), the hosts as ``-H`` names them
(``name:count,...``), the device pool (``o`` for ordinals, else ``p`` and the list), and the
``numactl`` to bind with; then the program.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

from popdist import env as contract
from poprun.config.run_config import RunConfig
from poprun.plan.environment import instance_values as contract_values
from poprun.plan.hosts import is_local
from poprun.plan.topology import InstancePlan, Topology, spread_numa

#: The contract values every instance of a job shares: in the command once per context.
JOB_WIDE: tuple[str, ...] = (
    contract.NUM_TOTAL_REPLICAS,
    contract.NUM_IPUS_PER_REPLICA,
    contract.UNIFORM_REPLICAS_PER_INSTANCE,
    contract.NUM_INSTANCES,
    contract.OFFLINE_MODE,
)


class Context(NamedTuple):
    """One app context: consecutive instances that share their mpirun arguments."""

    #: The rank of its first instance, and how many instances it has (``-np``).
    first: int
    instances: int
    #: Its hosts in order, each with the instances of the whole job there (``-H name:count``).
    hosts: tuple[tuple[str, int], ...]
    #: The local index of its first instance on its first host (a host may span contexts).
    first_local: int
    #: Its first host is poprun's own (its instances there write to poprun's FIFOs).
    local: bool
    local_args: tuple[str, ...] = ()


class LaunchPlan(NamedTuple):
    """What every instance's values follow from: the job's numbers and its contexts."""

    num_replicas: int
    ipus_per_replica: int
    num_instances: int
    offline_mode: bool
    #: The user's ``CUDA_VISIBLE_DEVICES`` (None: device ordinals).
    pool: tuple[str, ...] | None
    #: NUMA nodes of each host to spread the instances over (0 or 1: no binding), and the
    #: ``numactl`` that binds them (None: none found, no binding).
    numa_nodes: int
    numactl: str | None
    contexts: tuple[Context, ...]


def plan_launch(
    config: RunConfig,
    topology: Topology,
    pool: Sequence[str] | None = None,
    numactl: str | None = None,
) -> LaunchPlan:
    """The contexts of ``topology``'s instances (one pass over them; see the module doc)."""
    local_hosts = {host: is_local(host) for host in topology.hosts}
    groups: list[list[InstancePlan]] = []
    previous: tuple[str, ...] | None = None
    for plan in topology.instances:
        args = tuple(config.local_args(plan.index))
        if args != previous or (plan.local_index == 0 and local_hosts.get(plan.host, False)):
            groups.append([])
        groups[-1].append(plan)
        previous = args
    nodes = max((max(p.numa_nodes, default=-1) + 1 for p in topology.instances), default=0)
    contexts = tuple(_context(group, config, local_hosts) for group in groups)
    return LaunchPlan(
        num_replicas=config.num_replicas,
        ipus_per_replica=config.ipus_per_replica,
        num_instances=config.num_instances,
        offline_mode=config.offline_mode,
        pool=None if pool is None else tuple(pool),
        numa_nodes=nodes,
        numactl=numactl,
        contexts=contexts,
    )


def _context(group: list[InstancePlan], config: RunConfig, local: dict[str, bool]) -> Context:
    hosts: list[tuple[str, int]] = []
    for plan in group:
        if not hosts or hosts[-1][0] != plan.host or plan.local_index == 0:
            hosts.append((plan.host, plan.num_local_instances))
    first = group[0]
    return Context(
        first=first.index,
        instances=len(group),
        hosts=tuple(hosts),
        first_local=first.local_index,
        local=local.get(first.host, False),
        local_args=tuple(config.local_args(first.index)),
    )


def instance_plan(launch: LaunchPlan, rank: int) -> InstancePlan:
    """Instance ``rank``'s plan, from the launch plan alone: what its wrapper works out."""
    if not 0 <= rank < launch.num_instances:
        raise ValueError(f"rank {rank} is not one of the job's {launch.num_instances} instances")
    firsts = [c.first for c in launch.contexts]
    context = launch.contexts[bisect.bisect_right(firsts, rank) - 1]
    local = rank - context.first + context.first_local
    host, count = context.hosts[-1]
    for host, count in context.hosts:  # noqa: B007 - the loop finds them
        if local < count:
            break
        local -= count
    replicas, offset = contract.replica_share(launch.num_replicas, launch.num_instances, rank)
    return InstancePlan(
        index=rank,
        host=host,
        local_index=local,
        num_local_instances=count,
        replica_offset=offset,
        num_local_replicas=replicas,
        ipus_per_replica=launch.ipus_per_replica,
        numa_nodes=spread_numa(local, count, launch.numa_nodes),
    )


def instance_values(launch: LaunchPlan, rank: int) -> dict[str, str]:
    """Every value instance ``rank`` gets: the job-wide ones, then its own."""
    return contract_values(launch, instance_plan(launch, rank), launch.pool)


def job_values(launch: LaunchPlan) -> dict[str, str]:
    """The values every instance shares (:data:`JOB_WIDE`), as instance 0 has them."""
    first = instance_values(launch, 0)
    return {name: first[name] for name in JOB_WIDE if name in first}


def host_list(context: Context) -> str:
    """The context's hosts as ``-H`` (and the wrapper) read them: ``name:count,...``."""
    return ",".join(f"{host}:{count}" for host, count in context.hosts)


def wrapper_args(launch: LaunchPlan, context: Context) -> list[str]:
    """The wrapper's arguments for ``context`` (after its ``$0``; see the module doc)."""
    counts = {count for _, count in context.hosts}
    each = counts.pop() if len(counts) == 1 else 0
    numa = launch.numa_nodes if launch.numactl and launch.numa_nodes > 1 else 0
    numbers = (context.first, context.first_local, each, int(context.local), numa)
    pool = "o" if launch.pool is None else "p" + ",".join(launch.pool)
    return [" ".join(map(str, numbers)), host_list(context), pool, (numa and launch.numactl) or ""]


#: The instance's own values from its rank, in POSIX sh (``dash``): a few arithmetic
#: expansions, and a walk over the hosts only when their counts differ. Functions keep the
#: program's ``"$@"``; every name it sets starts with ``_pr`` and is unset at the end.
DERIVE = (
    "set -f; _prr=$OMPI_COMM_WORLD_RANK; _prq=$4; _prd=$3; _prh=$2; "
    "_prf() { _prk=$((_prr - $1 + $2)); _prn=$3; _prl=$4; _prm=$5; }; _prf $1; shift 4; "
    "_pre() { _prE=0; if [ $_prn -gt 0 ]; then _prE=$((_prk / _prn)); shift $_prE; "
    "_prk=$((_prk % _prn)); else while [ $# -gt 1 ] && [ $_prk -ge ${1##*:} ]; do "
    "_prk=$((_prk - ${1##*:})); _prE=$((_prE + 1)); shift; done; fi; "
    "_prH=${1%:*}; _prN=${1##*:}; }; IFS=,; _pre $_prh; unset IFS; "
    "_prc=$POPDIST_NUM_INSTANCES; _prb=$((POPDIST_NUM_TOTAL_REPLICAS / _prc)); "
    "_prx=$((POPDIST_NUM_TOTAL_REPLICAS % _prc)); _pro=$((_prr < _prx ? _prr : _prx)); "
    "_prR=$((_prb + (_prr < _prx))); _pro=$((_prr * _prb + _pro)); "
    "_prs=$((_prR * POPDIST_NUM_IPUS_PER_REPLICA)); _prg=$((_prk * _prs)); _prv=; "
    "_prp() { _pri=0; for _prw; do if [ $_pri -ge $_prg ] && [ $_pri -lt $((_prg + _prs)) ]; "
    "then _prv=$_prv${_prv:+,}$_prw; fi; _pri=$((_pri + 1)); done; }; "
    "if [ $_prd = o ]; then _pri=$_prg; while [ $_pri -lt $((_prg + _prs)) ]; do "
    "_prv=$_prv${_prv:+,}$_pri; _pri=$((_pri + 1)); done; "
    "else IFS=,; _prp ${_prd#p}; unset IFS; fi; "
    "if [ $_prm -gt 1 ]; then _pri=$((_prk * _prm / _prN)); _prz=$((_pri + 1)); "
    "if [ $_prN -le $_prm ]; then _prz=$(((_prk + 1) * _prm / _prN)); fi; _pru=; "
    "while [ $_pri -lt $_prz ]; do _pru=$_pru${_pru:+,}$_pri; _pri=$((_pri + 1)); done; "
    'set -- "$_prq" "--cpunodebind=$_pru" "--membind=$_pru" "$@"; fi; '
    f'export {contract.NUM_LOCAL_REPLICAS}="$_prR" {contract.REPLICA_INDEX_OFFSET}="$_pro" '
    f'{contract.LOCAL_INSTANCE_INDEX}="$_prk" {contract.INSTANCE_INDEX}="$_prr" '
    f'{contract.NUM_LOCAL_INSTANCES}="$_prN" {contract.HOST}="$_prH" '
    'CUDA_VISIBLE_DEVICES="$_prv"; set +f; _prL=$_prl$_prE; '
    "unset -f _prf _pre _prp; unset _prr _prq _prd _prh _prk _prn _prl _prm _prE _prH _prN "
    "_prc _prb _prx _pro _prR _prs _prg _prv _pri _prw _prz _pru; "
)
