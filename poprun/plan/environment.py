"""The environment (pure): what each instance gets and what mpirun itself runs with.

The user's environment is forwarded *by name* (``-x NAME``; mpirun reads the value from its
own environment, so spaces and quotes survive), except a small denylist. The PopDist
contract (``popdist.env``) is exported per instance inside its own app context.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from popdist import env as contract
from poprun.config.run_config import RunConfig
from poprun.plan.devices import VISIBLE_DEVICES, instance_devices
from poprun.plan.hosts import is_local
from poprun.plan.topology import InstancePlan

#: Never forwarded: shell functions, the shell's bookkeeping, the launcher's own variables
#: (mpirun sets OMPI_*/PMIX_*; poprun sets POPDIST_* and each instance's slice of
#: CUDA_VISIBLE_DEVICES per instance, see :mod:`poprun.plan.devices`), and Slurm's: in a
#: Slurm job each node's instances get them from the ``srun`` step that started Open MPI's
#: daemon there (``SLURMD_NODENAME``, ``SLURM_NODEID``, ... are per node: the launch node's
#: values would be wrong on the others); instances on poprun's own host inherit them.
#: ``HOSTNAME`` and an operator's role variable (``K_MPI_JOB_ROLE``) name the launcher's own
#: host: another host's instances keep their own. Each engine adds the variables that
#: describe only the node poprun runs on (``JobAllocation.local_only``: the PBS node file,
#: Grid Engine's ``PE_HOSTFILE`` and ``TMPDIR``, LSF's ``LSB_DJOB_HOSTFILE``, ...).
DENY_PREFIXES: tuple[str, ...] = ("BASH_FUNC_", "OMPI_", "PMIX_", "POPDIST_", "SLURM_", "SLURMD_")
DENY_NAMES = frozenset(
    {"OLDPWD", "_", "PWD", "SHLVL", VISIBLE_DEVICES, "HOSTNAME", "K_MPI_JOB_ROLE"}
)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: Set for every instance so that Python output streams live, not at exit.
UNBUFFERED = "PYTHONUNBUFFERED"

#: glibc malloc thresholds for every instance, unless the user chose their own or passed
#: ``--use-default-allocator``. By default glibc hands freed memory back to the kernel
#: (heap trimming above 2x its dynamic mmap threshold), so a training step that frees its
#: activations and gradients faults the same pages in again on the next step: hundreds to
#: thousands of page faults a step in the training benchmark, each a few microseconds (its
#: tables have a column for them). These keep freed memory in the process, as PyTorch's CPU launcher
#: does with jemalloc: an instance stays at its peak footprint, which it needs every step.
#: Both are set together: either one alone turns off glibc's dynamic threshold and pins the
#: other at 128 KiB, which is far worse than the default. 32 MiB is the largest mmap
#: threshold every glibc accepts (its own dynamic ceiling on 64-bit hosts).
ALLOCATOR_DEFAULTS: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
}

#: glibc's tunables, ``name=value`` pairs joined by ``:``.
TUNABLES = "GLIBC_TUNABLES"
#: glibc's malloc (2.35 and later; earlier ones ignore a tunable they do not know) asks the
#: kernel for transparent huge pages (2 MB) for its heap and its mapped chunks. Added to
#: every instance's ``GLIBC_TUNABLES`` unless the user set it or passed
#: ``--use-default-allocator``. Open MPI's shared-memory transport copies a large message
#: straight from one process into the other (CMA, ``process_vm_readv``), and the kernel
#: walks that memory page by page: a 16 MB buffer is 4,096 pages of 4 KB and 8 of 2 MB.
#: Measured on 2 cores, 2 instances (issue 33): a 16 MB allreduce of a gradient from
#: torch's allocator 3.05 -> 1.59 ms on the executor's path, 2.86 -> 1.33 ms in raw MPI;
#: 1 MB 0.244 -> 0.124 ms; MLP training +5 %, the CNN unchanged; an instance's RSS +8 MB.
#: Where the kernel's THP setting is ``never`` it does nothing.
HUGE_PAGES = "glibc.malloc.hugetlb"


def _tunable_names(environ: Mapping[str, str]) -> list[str]:
    return [pair.split("=", 1)[0].strip() for pair in environ.get(TUNABLES, "").split(":") if pair]


def user_chose_allocator(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` already sets glibc malloc's thresholds or arenas (``MALLOC_*`` or
    a malloc tunable other than :data:`HUGE_PAGES`)."""
    return any(name.startswith("MALLOC_") for name in environ) or any(
        name.startswith("glibc.malloc.") and name != HUGE_PAGES for name in _tunable_names(environ)
    )


def allocator_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables poprun adds to ``environ`` for every instance: the thresholds unless the
    user chose malloc settings, and huge pages (appended to their own ``GLIBC_TUNABLES``)
    unless they set :data:`HUGE_PAGES` themselves."""
    added = {} if user_chose_allocator(environ) else dict(ALLOCATOR_DEFAULTS)
    if HUGE_PAGES not in _tunable_names(environ):
        added[TUNABLES] = ":".join(filter(None, [environ.get(TUNABLES, ""), f"{HUGE_PAGES}=1"]))
    return added


def with_allocator_defaults(config: RunConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` plus :func:`allocator_defaults`, which then go to every instance by name."""
    if config.use_default_allocator:
        return dict(environ)
    return {**environ, **allocator_defaults(environ)}


def forwarded_names(
    environ: Mapping[str, str], local_only: frozenset[str] = frozenset()
) -> list[str]:
    """The user's variables to export by name, sorted: all but :data:`DENY_NAMES`, the
    prefixes, and ``local_only`` (the engine's variables of this node alone)."""
    return sorted(
        name
        for name in environ
        if _NAME.match(name)
        and name not in DENY_NAMES
        and name not in local_only
        and (not name.startswith(DENY_PREFIXES) or name in contract.USER_TUNING)
    )


def shared_values(config: RunConfig) -> dict[str, str]:
    """Values identical for every instance, exported by name from mpirun's own environment."""
    values = {UNBUFFERED: "1", contract.ERROR_RECORD: "1", contract.BACKEND: config.backend}
    # The instances report their progress (the supervisor puts the job's secret in its place).
    values[contract.PROGRESS] = "1"
    if config.hang_timeout is not None:  # their stacks come once they stop moving for half
        values[contract.PROGRESS_STACKS] = f"{config.hang_timeout / 2:g}"
    if config.executable_cache_path:
        values[contract.EXECUTABLE_CACHE_PATH] = config.executable_cache_path
    if config.deterministic_reduction:
        values[contract.DETERMINISTIC_REDUCTION] = "1"
    if config.poptorch_modules:
        values[contract.POPTORCH_MODULES] = "1"
    if config.min_hosts is not None:  # the supervisor sets it at each launch
        values[contract.GENERATION] = "0"
    if config.min_hosts is not None and any(not is_local(h) for h in config.hosts):
        values[contract.LEASE] = ""  # the supervisor's lease server (docs/elastic.md)
    return values


class Job(Protocol):
    """The job's numbers an instance's values need: a :class:`RunConfig` has them, and so
    has the compact launch plan (:class:`poprun.plan.compact.LaunchPlan`)."""

    @property
    def num_replicas(self) -> int: ...
    @property
    def ipus_per_replica(self) -> int: ...
    @property
    def num_instances(self) -> int: ...
    @property
    def offline_mode(self) -> bool: ...


def instance_values(
    config: Job, plan: InstancePlan, device_pool: Sequence[str] | None = None
) -> dict[str, str]:
    """The contract values of one instance (plain integers and a host name), then its GPUs.

    ``device_pool`` is the user's ``CUDA_VISIBLE_DEVICES`` list (``None``: ordinals).
    """
    uneven = bool(config.num_replicas % config.num_instances)  # hosts lost: one more on some
    values = contract.instance_environment(
        num_total_replicas=config.num_replicas,
        num_ipus_per_replica=config.ipus_per_replica,
        num_instances=config.num_instances,
        instance_index=plan.index,
        local_instance_index=plan.local_index,
        num_local_instances=plan.num_local_instances,
        host=plan.host,
        offline_mode=config.offline_mode,
        num_local_replicas=plan.num_local_replicas if uneven else None,
        replica_index_offset=plan.replica_offset if uneven else None,
    )  # the cache path is shared: it goes by name (shared_values)
    values[VISIBLE_DEVICES] = instance_devices(plan, device_pool)
    return values


def mpirun_environment(config: RunConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """mpirun's own environment: the user's, plus the shared values it exports by name."""
    env = {
        k: v
        for k, v in environ.items()
        if not k.startswith("POPDIST_") or k in contract.USER_TUNING
    }
    env.update(shared_values(config))
    return env
