"""The mpirun command (pure): O(hosts) words, one app context per run of instances that share
their mpirun arguments (:mod:`poprun.plan.compact`), as an argv list.

Shape::

    mpirun --tag-output --bind-to none [--allow-run-as-root] [--oversubscribe]
           [--mca pml ob1 --mca btl self,vader,tcp]      (one host, unless the user chose)
           [--mca pml ob1]                               (hosts, among them this one, no fabric)
           [--mca coll_tuned_use_dynamic_rules 1
            --mca coll_tuned_dynamic_rules_filename R]   (one host, unless the user chose coll*)
           [--mca mpi_yield_when_idle 1]                 (threads outnumber a host's cores)
           [--mca btl_tcp_if_include S --mca oob_tcp_if_include S] <--mpi-global-args>
           -np N [-H host:k,host:k...] -x NAME ...       (forwarded by name, in every context)
                 -x POPDIST_NUM_TOTAL_REPLICAS=v ...     (the values every instance shares)
                 <local args> INSTANCE_WRAPPER PLAN... program args
           [: -np M ...]                                 (a context at this host's instances,
                                                          and at other per-instance args)

:data:`INSTANCE_WRAPPER` works out its instance's own values (local replicas, replica offset,
local index, host, ``CUDA_VISIBLE_DEVICES``, NUMA binding) from ``OMPI_COMM_WORLD_RANK`` and
the compact plan in its arguments (:data:`poprun.plan.compact.DERIVE`), exports them, and goes
on as :data:`WRAPPER` on poprun's own host or as :data:`REMOTE_WRAPPER` elsewhere. The
command is the same whatever the job's size but for the host list: 16,384 instances on 2,048
hosts take about 50 KB (``benchmarks/scale.py``), where one context per instance took 1.6 MB
at 1,024 instances, past Linux's limit on a command's argv and environment (``E2BIG``).

Inside a Slurm job (``topology.allocation``), the contexts name the job's nodes (``-H n1:2,n2:2``)
and Open MPI starts its daemons on them with ``srun`` (its ``plm_slurm``), not ssh; poprun
adds ``--oversubscribe`` there, having checked the plan against the job's tasks itself:
Open MPI counts a node's slots as its CPUs divided by the CPUs per task, which is fewer
than its tasks when the job overcommits (``sbatch -O``), and refuses with a bare "All nodes
which are allocated for this job are already filled". When poprun itself runs in an
``srun`` step, that step holds the CPUs of its node, and the ``srun`` that starts Open MPI's
daemons would wait for them for ever: ``--mca plm_slurm_args --overlap`` lets it share them
(unless the user set ``plm_slurm_args``). Open MPI places no more ranks on a node than it
counts slots there, so poprun has it count the job's CPUs, not the step's tasks
(:data:`poprun.plan.slurm.RAS_MCA`): the ``-H`` counts then hold.

``WRAPPER`` is ``/bin/sh -c '<FIFOs>; printf ... >&2; exec "$@"' poprun-instance``: on
poprun's own host it points the instance's stdout and stderr at poprun's FIFOs
(:mod:`poprun.run.output.fifos`), it reports the instance's pid as the first line of its stderr
(poprun strips it) and then *becomes* the program, so the program's argv is untouched and
its pid is the one reported.

An instance on another host gets :data:`REMOTE_WRAPPER` instead: poprun sees neither its pid
nor its exit, and mpirun does not always say how it ended (across hosts it leaves out the box
naming a process that fails right at the start, about one run in four). That wrapper runs the
program as its foreground child (a nested ``sh`` reports the pid and execs it, so the pid is
the program's), then writes :data:`EXIT_MARKER`, the status (``Popen`` style: the exit code,
or ``-N`` for signal N) and when it saw the program end (``date +%s.%N``: which instance
failed first is told by when, not by which record reached poprun first,
:mod:`poprun.run.membership.blame`) as the last line of the instance's stderr, and ends the same way
(it re-raises the signal on itself), so mpirun's view is unchanged. Open MPI's daemon signals
each instance's process group (``odls_base_signal_direct_children_only`` is false by
default), so its SIGTERM and SIGKILL reach the program; the wrapper only traps HUP, INT and
TERM with a no-op (``true``), which waits for the program (exec resets a trapped signal, so the program
keeps the default handlers: Python still gets its KeyboardInterrupt). The wrapper's own
stderr is ``/dev/null`` (the program's is the real one, also kept on descriptor 3 for the
status line), so the shell's "Terminated" notes never reach the output.

Both wrappers start the program with SIGUSR1 *ignored* (an ignored signal stays ignored
across ``exec``): SIGUSR1 is poprun's save-now notice (:mod:`poprun.run.time_limit`), which
mpirun forwards to each instance's process group. ``import popdist`` installs the handler
that turns it into a flag (:mod:`popdist.deadline`); a program that never imports popdist
(or is still starting) is not killed by it.

On one host, poprun pins Open MPI to shared memory (``pml ob1``, ``btl self,vader,tcp``):
Open MPI's default selection probes UCX and libfabric first, which costs about 0.2 s in
every ``MPI_Init`` (so in every ``popdist.init()``) and gains nothing without a fabric
(``benchmarks/launchers.py`` measures it). A choice the user made, by ``--mca`` in the
mpirun args or ``OMPI_MCA_<name>`` in the environment, is left alone.

Across hosts, poprun names ``pml ob1`` (Open MPI's TCP path; its ``btl`` choice stays
Open MPI's) when this host is one of the job's and has no fabric device
(:mod:`poprun.plan.fabric`): that is where Open MPI's own selection ends, 0.2 s later, and
data between this host and the others can only go over TCP anyway. A job on hosts that have
a fabric (seen from here), or launched from a host outside the job (a login node tells
nothing of the compute nodes), keeps Open MPI's selection, which finds the fabric. Measured
on two namespace hosts (``benchmarks/multihost.py``): a launch with ``popdist.init()`` takes
1.38 s against bare mpirun's 1.57 s (``MPI_Init`` 0.24 s shorter).

On one host, poprun also gives Open MPI's tuned collectives :data:`ALLREDUCE_RULES`: an
allreduce of 32 MiB or more runs as a segmented ring with 1 MiB segments. Open MPI's own
choice for such a message reduces into a temporary buffer as large as the message,
malloc'ed and freed on every call, and glibc serves an allocation that large with a fresh
mmap, so every call faults in again the part it writes: on 2 ranks, half, 4,097 page faults
a call at 32 MiB and 32,769 at 256 MiB. The segments' buffers stay in the heap. Measured
with 2 instances on 2 cores (``benchmarks/allreduce.py``), 64 and 256 MiB go from about 1.5
to 3.9-5.6 GB/s, and a buffer that starts on a page boundary (as ``THP_MEM_ALLOC_ENABLE=1`` or a
page-aligning allocator leaves a gradient) no longer loses a third of that: the kernel's
cross-process copy from it into the fresh buffer, which glibc starts 16 bytes into its first
page, was the slow case. Smaller messages keep Open MPI's choice. A user who sets any
``coll*`` parameter keeps Open MPI's defaults; runs with explicit hosts do too.

Each instance that starts Horovod has two busy threads: its compute thread and Horovod's
background thread, which negotiates every millisecond and spins in MPI while it waits for
its peers. When those threads outnumber the host's cores, spinning steals the cores the
compute threads need, so poprun sets ``mpi_yield_when_idle``: a waiting MPI call yields
its core. With several hosts the count is per host, each host assumed to have as many
cores as this one. Measured on 2 cores with 2 instances when it was introduced: +20 % (MLP)
to +25 % (CNN) training throughput (``benchmarks/training_throughput.py``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence

from popdist.env import threads_outnumber_cores
from poprun.config.run_config import RunConfig
from poprun.errors import PoprunError
from poprun.plan.compact import (
    DERIVE,
    LaunchPlan,
    host_list,
    job_values,
    plan_launch,
    wrapper_args,
)
from poprun.plan.environment import shared_values
from poprun.plan.hosts import is_local
from poprun.plan.topology import Topology

#: The first line each instance writes to its stderr, before exec'ing the program.
PID_MARKER = b"\x1fpoprun-pid="
#: The wrappers' own variables, set in every context (job-wide, O(1)) and unset before the
#: program starts: ``setpriv``'s path, and the variables to unset on other hosts.
PDEATHSIG, UNSET = "POPRUN_PDEATHSIG", "POPRUN_UNSET"
#: Where poprun made FIFOs for this instance (``poprun.run.output.fifos``), the wrapper points
#: its stdout and stderr at them; everywhere else mpirun forwards them.
_DIRECT = (
    'd=$POPRUN_DIRECT_OUTPUT; unset POPRUN_DIRECT_OUTPUT; f="$d/$POPDIST_INSTANCE_INDEX"; '
    'if [ -n "$d" ] && [ -p "$f.stderr" ]; then exec >"$f.stdout" 2>"$f.stderr"; fi; '
)
_PID_AND_EXEC = 'trap "" USR1; printf "\\037poprun-pid=%d\\n" "$$" >&2; exec "$@"'
WRAPPER: tuple[str, ...] = (
    "/bin/sh",
    "-c",
    f"unset {PDEATHSIG} {UNSET}; {_DIRECT}{_PID_AND_EXEC}",
    "poprun-instance",
)
#: The last line an instance on another host writes to its stderr: how the program ended.
EXIT_MARKER = b"\x1fpoprun-exit="
#: ``$?`` of a program killed by a signal whose default is to end it (128 + N): HUP..STKFLT
#: (1-16) and XCPU..SYS (24-31) less WINCH (28). Any other status is an exit code.
_KILLED = "129|13?|14[0-4]|15[2-57-9]"
_REPORT_EXIT = (
    f"s=$?; r=$s; case $s in {_KILLED}) r=-$((s - 128));; esac; "
    'printf "\\037poprun-exit=%d %s\\n" "$r" "$(date +%s.%N)" >&3; '
    'trap - HUP INT TERM; case $r in -*) kill "$r" "$$";; esac; exit "$s"'
)
#: On another host the program dies with its wrapper, and the wrapper with Open MPI's
#: daemon (``setpriv --pdeathsig KILL``, where poprun found it: ``$POPRUN_PDEATHSIG``): a
#: daemon killed outright (a scheduler's ``qdel``) leaves no instance behind. Before that the
#: engine's node-only variables its start carried over are unset (``$POPRUN_UNSET``).
_REMOTE_EXEC = (
    '_prZ=$_prP; unset _prP; trap "" USR1; printf "\\037poprun-pid=%d\\n" "$$" >&2; '
    'if [ -n "$_prZ" ]; then exec "$_prZ" --pdeathsig KILL "$@"; fi; exec "$@"'
)
REMOTE_WRAPPER: tuple[str, ...] = (
    "/bin/sh",
    "-c",
    f'_prP=${PDEATHSIG}; for _prU in ${UNSET}; do unset "$_prU"; done; '
    f"unset {PDEATHSIG} {UNSET} _prU; "
    'trap true HUP INT TERM; trap "" USR1; exec 3>&2 2>/dev/null; '
    f"_prP=$_prP /bin/sh -c 'exec 2>&3 3>&-; {_REMOTE_EXEC}' poprun-instance \"$@\"; "
    f"{_REPORT_EXIT}",
    "poprun-instance",
)
#: What every instance starts as: its values worked out from its rank
#: (:data:`~poprun.plan.compact.DERIVE`), then :data:`WRAPPER`'s script on poprun's own host
#: (the first host of its context, :mod:`poprun.plan.compact`), else :data:`REMOTE_WRAPPER`'s.
INSTANCE_WRAPPER: tuple[str, ...] = (
    "/bin/sh",
    "-c",
    f'{DERIVE}if [ "$_prL" = 10 ]; then unset _prL; {WRAPPER[2]}; fi; unset _prL; '
    f"{REMOTE_WRAPPER[2]}",
    "poprun-instance",
)
_BINDING_FLAGS = frozenset({"--bind-to", "-bind-to"})
#: Open MPI selections for a single-host run (see the module docstring).
SINGLE_HOST_MCA: tuple[tuple[str, str], ...] = (("pml", "ob1"), ("btl", "self,vader,tcp"))
#: ... and across hosts without a fabric, this one among them.
TCP_HOSTS_MCA: tuple[str, str] = ("pml", "ob1")
#: Open MPI's allreduce for large messages on one host (see the module docstring).
ALLREDUCE_RULES = os.path.join(os.path.dirname(__file__), "allreduce.rules")
ALLREDUCE_MCA: tuple[tuple[str, str], ...] = (
    ("coll_tuned_use_dynamic_rules", "1"),
    ("coll_tuned_dynamic_rules_filename", ALLREDUCE_RULES),
)
#: ... and when the instances' threads (compute + Horovod's) outnumber the cores.
YIELD_MCA: tuple[str, str] = ("mpi_yield_when_idle", "1")
_MCA_FLAGS = frozenset({"--mca", "-mca", "--gmca", "-gmca"})


def find_setpriv(environ: Mapping[str, str]) -> str | None:
    """util-linux's ``setpriv``, if it is on PATH and knows ``--pdeathsig`` (2.33 and later;
    its option table is in the program itself, read here without running it). The hosts of
    a job are taken to have the same tools as this one, as for the program's path."""
    path = shutil.which("setpriv", path=environ.get("PATH", os.defpath))
    if path is None:
        return None
    try:
        with open(path, "rb") as program:
            knows = b"pdeathsig" in program.read(4 << 20)
    except OSError:
        return None
    return path if knows else None


def find_mpirun(environ: Mapping[str, str]) -> str:
    """The mpirun on PATH, or a usage error saying how to get one."""
    path = shutil.which("mpirun", path=environ.get("PATH", os.defpath))
    if path is None:
        raise PoprunError(
            "mpirun",
            None,
            "is not on PATH",
            "install Open MPI (apt-get install openmpi-bin) or add its bin directory to PATH",
        )
    return path


def _poprun_mca(
    config: RunConfig,
    topology: Topology,
    launch: LaunchPlan,
    chosen: frozenset[str],
    local_cpus: int,
    fabric_here: bool,
) -> list[str]:
    """poprun's own ``--mca`` settings, less those the user chose (``chosen`` or local args)."""
    for context in launch.contexts:
        chosen |= _mca_names(context.local_args)
    wanted: list[tuple[str, str]] = []
    if not topology.explicit_hosts:
        wanted += SINGLE_HOST_MCA
        if not any(name.startswith("coll") for name in chosen):
            wanted += ALLREDUCE_MCA  # the user's own collective tuning wins as a whole
    elif not fabric_here and any(is_local(host) for host in topology.hosts):
        wanted.append(TCP_HOSTS_MCA)
    # Remote hosts are assumed to have as many cores as this one (as for NUMA nodes).
    per_host = max(count for context in launch.contexts for _, count in context.hosts)
    if threads_outnumber_cores(per_host, local_cpus):
        wanted.append(YIELD_MCA)
    # How the engine's mpirun starts its daemons is the allocation's data (plan/engines)
    launcher = topology.allocation.launcher if topology.allocation is not None else None
    if launcher is not None:
        wanted += launcher.mca
        if config.min_hosts is not None:
            wanted += [pair for pair in launcher.elastic_mca if pair not in launcher.mca]
        if launcher.agent is not None:
            wanted.append(("plm_rsh_agent", launcher.agent))
    out = []
    for name, value in wanted:
        if name not in chosen:
            out += ["--mca", name, value]
    if config.host_subnet:
        out += ["--mca", "btl_tcp_if_include", config.host_subnet]
        out += ["--mca", "oob_tcp_if_include", config.host_subnet]
    return out


def build_argv(
    config: RunConfig,
    topology: Topology,
    *,
    mpirun: str,
    forwarded: Sequence[str],
    is_root: bool,
    local_cpus: int,
    numactl: str | None = None,
    user_mca: frozenset[str] = frozenset(),
    device_pool: Sequence[str] | None = None,
    fabric_here: bool = True,
    setpriv: str | None = None,
) -> list[str]:
    """The exact mpirun argv for this run (golden-tested): O(hosts) words, one app context
    per :class:`~poprun.plan.compact.Context` of the compact launch plan.

    ``user_mca`` names the MCA parameters the user set in the environment
    (``OMPI_MCA_<name>``); poprun's single-host defaults never override them.
    ``device_pool`` is the user's ``CUDA_VISIBLE_DEVICES`` (:mod:`poprun.plan.devices`).
    ``fabric_here``: whether this host has a fabric device (:mod:`poprun.plan.fabric`).
    ``setpriv``: util-linux's ``setpriv`` with ``--pdeathsig`` (:func:`find_setpriv`), where
    the hosts have it: across hosts each instance then dies with Open MPI's daemon.
    """
    user_global = config.global_args()
    argv = [mpirun, "--tag-output"]
    if not _BINDING_FLAGS.intersection(user_global):
        argv += ["--bind-to", "none"]
    if is_root or config.allow_run_as_root:
        argv.append("--allow-run-as-root")
    engine_slots = topology.allocation is not None and topology.allocation.launcher.oversubscribe
    if engine_slots or (not topology.explicit_hosts and config.num_instances > local_cpus):
        # -H host:k contexts carry their own slot counts, except where mpirun reads the
        # engine's (a Slurm job): poprun has checked the instances against those
        argv.append("--oversubscribe")
    chosen = user_mca | _mca_names(user_global)
    launch = plan_launch(config, topology, device_pool, numactl)
    argv += _poprun_mca(config, topology, launch, chosen, local_cpus, fabric_here)
    argv += user_global
    # Open MPI 4.1 applies a -x placed before the first app context to that context only:
    # the names go into every context, or instances on other hosts miss them.
    exported: list[str] = []
    for name in sorted({*forwarded, *shared_values(config)}):
        exported += ["-x", name]
    guard = _remote_guards(topology, setpriv)
    for name, value in {**job_values(launch), **guard}.items():
        exported += ["-x", f"{name}={value}"]
    for context in launch.contexts:
        if context.first:
            argv.append(":")
        argv += ["-np", str(context.instances)]
        if topology.explicit_hosts:
            argv += ["-H", host_list(context)]
        argv += exported
        argv += context.local_args
        if PDEATHSIG in guard:  # the wrapper itself dies with Open MPI's daemon
            argv += [guard[PDEATHSIG], "--pdeathsig", "KILL"]
        argv += [*INSTANCE_WRAPPER, *wrapper_args(launch, context), *config.program]
    return argv


def _remote_guards(topology: Topology, setpriv: str | None) -> dict[str, str]:
    """The remote wrapper's variables in a job across hosts: ``setpriv``'s path (the
    instances die with their daemon) and the engine's variables to unset over there."""
    if not topology.explicit_hosts or all(is_local(host) for host in topology.hosts):
        return {}
    guard = {PDEATHSIG: setpriv} if setpriv else {}
    allocation = topology.allocation
    if allocation is not None and allocation.launcher.unset_remote:
        guard[UNSET] = " ".join(allocation.launcher.unset_remote)
    return guard


def _mca_names(args: Sequence[str]) -> set[str]:
    """The MCA parameter names that ``--mca NAME VALUE`` pairs in ``args`` set."""
    return {args[i + 1] for i, arg in enumerate(args[:-1]) if arg in _MCA_FLAGS}


def mca_from_environment(environ: Mapping[str, str]) -> frozenset[str]:
    """MCA parameter names set as ``OMPI_MCA_<name>`` in ``environ``."""
    prefix = "OMPI_MCA_"
    return frozenset(k[len(prefix) :] for k in environ if k.startswith(prefix))


def quote(argv: Sequence[str]) -> str:
    """The argv as one shell-quoted line, for logs and ``--dry-run``."""
    import shlex

    return " ".join(shlex.quote(arg) for arg in argv)
