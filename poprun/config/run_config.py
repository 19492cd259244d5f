"""The run configuration: command-line values and an optional YAML file → one frozen RunConfig.

All validation happens here, before anything is launched. Each option's own value is read
and checked by its row of :data:`poprun.config.options.OPTIONS`; the rules *between* options
(replicas divisible by instances, hosts dividing instances, instance indices in range, the
older ``--numa-aware`` agreeing with ``--process-placement``) are the small functions below.
Each bad value raises a :class:`~poprun.errors.PoprunError` naming the option, the value
and the fix.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any, NamedTuple

from popdist.env import BACKENDS
from poprun.config.mpi_args import check_mpi_args
from poprun.config.options import (
    BY_KEY,
    OPTIONS,
    SSH_WAIT_S,
    VIPU_OPTIONS,
    parse_bool,
    split_words,
)
from poprun.config.paths import check_output_dir
from poprun.config.user_files import read_user_file
from poprun.errors import PoprunError
from poprun.plan.engines.allocation import JobAllocation, default_instances
from poprun.plan.engines.detect import detect
from poprun.plan.hosts import HostFile, JobHosts, host_source, is_local, parse_host_list

__all__ = ["RunConfig", "build", "parse_bool"]


class RunConfig(NamedTuple):
    """Everything one run needs, validated. Frozen: later stages only read it.

    mpirun arguments are stored split into words (``mpi_global_args``, ...), in order.
    """

    program: tuple[str, ...] = ()
    num_instances: int = 1
    num_replicas: int = 1
    ipus_per_replica: int = 1
    hosts: tuple[str, ...] = ()
    #: Instances on each of ``hosts`` (empty: no hosts given, all on this one).
    host_counts: tuple[int, ...] = ()
    #: The cluster engine's job poprun runs in (None outside one: :mod:`poprun.plan.engines`),
    #: and whether ``hosts`` are its nodes because no -H/--host-file was given.
    allocation: JobAllocation | None = None
    hosts_from_allocation: bool = False
    #: One line when several engines' variables are present: which was taken, and why.
    engine_note: str = ""
    mpi_global_args: tuple[str, ...] = ()
    mpi_local_args: tuple[str, ...] = ()
    instance_mpi_local_args: tuple[tuple[int, tuple[str, ...]], ...] = ()
    only_output_from_instance: int | None = None
    output_dir: str | None = None
    print_topology: bool = False
    dry_run: bool = False
    process_placement: str = "spreadnuma"
    offline_mode: bool = False
    backend: str = BACKENDS[0]
    #: ``--deterministic-reduction``: exported as ``POPDIST_DETERMINISTIC_REDUCTION=1``.
    deterministic_reduction: bool = False
    #: ``--poptorch-modules``: exported as ``POPDIST_POPTORCH_MODULES=1`` (docs/poptorch-names.md).
    poptorch_modules: bool = False
    executable_cache_path: str | None = None
    host_subnet: str | None = None
    timeout: float | None = None
    max_restarts: int = 0
    #: ``--min-hosts`` (None: every host is needed) and ``--readmit`` (:mod:`poprun.run.membership`).
    min_hosts: int | None = None
    readmit: bool = False
    #: ``--hang-timeout`` (None: off) and ``--on-hang`` (:mod:`poprun.run.progress`).
    hang_timeout: float | None = None
    on_hang: str = "kill"
    #: The save-now notice this long before the deadline, and the requeue at the time limit
    #: (:mod:`poprun.run.time_limit`).
    time_limit_margin: float | None = None
    requeue_on_timeout: bool = False
    #: ``--sigterm-grace``: SIGTERM to poprun is the save-now notice first (:mod:`poprun.run.ending`).
    sigterm_grace: float | None = None
    #: ``--status-port``: the live figures' HTTP port (0: a free one), on ``status_address``.
    status_port: int | None = None
    status_address: str | None = None
    allow_run_as_root: bool = False
    use_default_allocator: bool = False
    #: Check that every remote host answers ssh before launching (``--ssh-check``), trying
    #: a host that does not answer yet again for this long (``--ssh-wait``).
    ssh_check: bool = True
    ssh_wait: float = SSH_WAIT_S
    verbose: int = 0
    vipu: tuple[tuple[str, str], ...] = ()

    @property
    def num_local_replicas(self) -> int:
        """Replicas of one instance."""
        return self.num_replicas // self.num_instances

    def global_args(self) -> list[str]:
        """``--mpi-global-args``, in order."""
        return list(self.mpi_global_args)

    def local_args(self, instance: int) -> list[str]:
        """``--mpi-local-args`` then this instance's ``--instance-mpi-local-args``."""
        out = list(self.mpi_local_args)
        for index, words in self.instance_mpi_local_args:
            if index == instance:
                out.extend(words)
        return out

    def to_file_values(self) -> dict[str, Any]:
        """The effective configuration as YAML-ready values (``--export-config``).

        Written in :data:`~poprun.config.options.OPTIONS` order: the options marked ``always``,
        then every other one that is set.
        """
        out: dict[str, Any] = {}
        for option in OPTIONS:
            if not option.attribute:
                continue
            if option.attribute == "hosts" and self.hosts_from_allocation:
                continue  # the job's nodes: another job gets others
            value = getattr(self, option.attribute)
            if option.always or not (value is None or value is False or value == ()):
                out[option.key.replace("_", "-")] = option.dump(value) if option.dump else value
        for key, text in self.vipu:
            out[key.replace("_", "-")] = text
        return out


_FIELDS = frozenset(RunConfig._fields)


# --- rules between options --------------------------------------------------------------------


def _counts(values: Mapping[str, Any]) -> tuple[int, int]:
    """(instances, replicas): every instance gets the same whole number of replicas."""
    instances = values.get("num_instances", 1)
    replicas = values.get("num_replicas", 1)
    if instances > replicas:
        raise PoprunError(
            "--num-instances",
            instances,
            f"is more than --num-replicas={replicas}; every instance needs at least one replica",
            f"use --num-instances {replicas} or fewer, or raise --num-replicas",
        )
    if replicas % instances:
        lower = replicas - replicas % instances
        raise PoprunError(
            "--num-replicas",
            replicas,
            f"is not divisible by --num-instances={instances}",
            f"use a multiple of {instances} (e.g. {lower or instances} or {lower + instances})",
        )
    return instances, replicas


def _hosts(
    values: Mapping[str, Any], num_instances: int, allocation: JobAllocation | None
) -> tuple[tuple[str, ...], tuple[int, ...], bool]:
    """(hosts, instances on each, whether they are the engine's job's nodes): the run's
    host source (``-H``, ``--host-file``, else the job) places the instances."""
    source = host_source(values, allocation)
    if source is None:
        return (), (), False
    hosts, counts = source.place(num_instances)
    return hosts, counts, isinstance(source, JobHosts)


def engine_of(
    values: Mapping[str, Any], environ: Mapping[str, str]
) -> tuple[JobAllocation | None, str]:
    """The cluster engine's job poprun runs in (:mod:`poprun.plan.engines.detect`), if any,
    and the line that says which one when several are present."""

    def read(variable: str, path: str) -> str:
        return read_user_file(variable, path, "host file")

    def which(name: str) -> str | None:
        return shutil.which(name, path=environ.get("PATH", os.defpath))

    def expand(item: str, source: str, where: str) -> list[str]:
        return list(parse_host_list([item], f"{source} ({where})"))

    return detect(environ, values.get("mpi_global_args", ()), read, which, expand)


def _default_instances(values: dict[str, Any], allocation: JobAllocation | None) -> None:
    """No ``--num-instances``: one instance per slot (task) of the engine's job, or of a
    ``--host-file`` in Open MPI's format, as mpirun would run; else one."""
    if "num_instances" in values:
        return
    slots = allocation if not {"host", "host_file"} & set(values) else None
    if "host_file" in values and "host" not in values:
        slots = HostFile(values["host_file"]).slots()
    if slots is not None:
        values["num_instances"] = default_instances(slots, values.get("num_replicas"))


def _instance_args(text: str, num_instances: int) -> tuple[int, tuple[str, ...]]:
    """One ``--instance-mpi-local-args`` value, ``INDEX:ARGS``, for an instance that exists."""
    option = "--instance-mpi-local-args"
    index_text, sep, args = text.partition(":")
    if not sep:
        raise PoprunError(option, text, "has no 'INDEX:' prefix", f'write {option}=0:"-x NAME"')
    try:
        index = int(index_text.strip())
    except ValueError:
        raise PoprunError(
            option,
            text,
            f"instance index {index_text!r} is not an integer",
            f'write {option}=0:"-x NAME"',
        ) from None
    _check_instance(option, text, index, num_instances)
    return index, tuple(split_words(option, args))


def _check_instance(option: str, value: object, index: int, num_instances: int) -> None:
    if not 0 <= index < num_instances:
        raise PoprunError(
            option,
            value,
            f"instance {index} is out of range for --num-instances={num_instances}",
            f"use an index from 0 to {num_instances - 1}",
        )


def _placement(values: Mapping[str, Any]) -> str:
    """``--process-placement``, or what the older ``--numa-aware`` implies (they must agree)."""
    placement: str = values.get("process_placement", "spreadnuma")
    if "numa_aware" in values:
        implied = "spreadnuma" if values["numa_aware"] else "disabled"
        if "process_placement" in values and placement != implied:
            raise PoprunError(
                "--numa-aware",
                "yes" if values["numa_aware"] else "no",
                f"conflicts with --process-placement={placement}",
                "give only --process-placement (--numa-aware is its older name)",
            )
        placement = implied
    return placement


def _check_program(program: tuple[str, ...], environ: Mapping[str, str]) -> None:
    if not program:
        raise PoprunError(
            "program",
            None,
            "no program to run was given",
            "put the program and its arguments after the options, e.g. poprun --num-instances 2 python train.py",
        )
    name = program[0]
    if "/" in name:
        if not os.path.exists(name):
            raise PoprunError("program", name, "does not exist", "check the path")
        if os.path.isdir(name):
            raise PoprunError("program", name, "is a directory", "give the program's file")
        if not os.access(name, os.X_OK):
            raise PoprunError(
                "program",
                name,
                "is not executable",
                f"chmod +x {name}, or run it through its interpreter (python {name})",
            )
        _check_exec_format(name)
    elif shutil.which(name, path=environ.get("PATH", os.defpath)) is None:
        raise PoprunError("program", name, "is not found on PATH", "give its path, or fix PATH")


def _check_exec_format(name: str) -> None:
    """An executable must be a binary or start with ``#!``: else mpirun's exec fails (ENOEXEC)
    and a shell would run it as a shell script (a Python file without ``#!``)."""
    try:
        with open(name, "rb") as handle:
            head = handle.read(4)
    except OSError:
        return  # unreadable but executable: let exec decide
    if head.startswith(b"#!") or head == b"\x7fELF":
        return
    raise PoprunError(
        "program",
        name,
        "cannot be executed: Exec format error (neither a binary nor a script with a #! line)",
        f"add a first line such as '#!/usr/bin/env python3', or run it through its "
        f"interpreter (python {name})",
    )


def _check_time_limit(values: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """``--requeue-on-timeout`` needs a Slurm job; ``--time-limit-margin`` a deadline before it."""
    in_slurm = bool(environ.get("SLURM_JOB_ID"))
    if values.get("requeue_on_timeout") and not in_slurm:
        raise PoprunError(
            "--requeue-on-timeout",
            "yes",
            "needs a Slurm job to requeue, and SLURM_JOB_ID is not set",
            "run poprun inside sbatch or salloc, or leave --requeue-on-timeout out",
        )
    margin, timeout = values.get("time_limit_margin"), values.get("timeout")
    if margin is not None and not in_slurm and timeout is None:
        raise PoprunError(
            "--time-limit-margin",
            f"{margin:g}",
            "has no deadline to count back from (not a Slurm job, and no --timeout)",
            "run poprun inside a Slurm job, or add --timeout SECONDS",
        )
    if margin is not None and timeout is not None and margin >= timeout:
        raise PoprunError(
            "--time-limit-margin",
            f"{margin:g}",
            f"is not shorter than --timeout={timeout:g}: the notice would come at the start",
            "give a margin shorter than --timeout",
        )


def _merge(cli: Mapping[str, Any], file_values: Mapping[str, Any] | None) -> dict[str, Any]:
    """File values overridden by the command line (the hosts as a whole: -H or a file)."""
    given = {k: v for k, v in cli.items() if v is not None and v != [] and v != ()}
    merged: dict[str, Any] = dict(file_values or {})
    if "host" in given or "host_file" in given:
        merged.pop("host", None)
        merged.pop("host_file", None)
    merged.update(given)
    return merged


def _check_membership(
    values: Mapping[str, Any], hosts: tuple[str, ...], allocation: JobAllocation | None
) -> None:
    """``--min-hosts`` needs hosts to lose and at most their number; ``--readmit`` needs it."""
    least = values.get("min_hosts")
    if values.get("readmit") and allocation is not None:
        raise PoprunError(
            "--readmit", "yes", f"is not supported inside a Slurm job ({allocation.job_id}): "
            "a lost node comes back to Slurm, not to this job",
            "leave --readmit out inside Slurm (--min-hosts works; see docs/elastic.md)",
        )  # fmt: skip
    if least is not None:
        if len(hosts) < 2:
            raise PoprunError(
                "--min-hosts", least, "needs a job across hosts",
                "give two or more hosts (-H/--host or --host-file), or leave --min-hosts out",
            )  # fmt: skip
        if least > len(hosts):
            raise PoprunError(
                "--min-hosts", least, f"is more than the job's {len(hosts)} hosts",
                f"use --min-hosts {len(hosts)} or fewer",
            )  # fmt: skip
    if values.get("readmit") and least is None:
        raise PoprunError(
            "--readmit", "yes", "needs --min-hosts (a host must be left out to come back)",
            "add --min-hosts N, or leave --readmit out",
        )  # fmt: skip


def build(
    cli: Mapping[str, Any],
    program: tuple[str, ...],
    environ: Mapping[str, str],
    *,
    file_values: Mapping[str, Any] | None = None,
    require_program: bool = True,
) -> RunConfig:
    """Merge file values and command-line values (the command line wins) and validate.

    ``cli`` holds only the options given on the command line (canonical keys); ``None``
    or an empty list means "not given".
    """
    merged = _merge(cli, file_values)
    values = {key: BY_KEY[key].read(value) for key, value in merged.items() if key in BY_KEY}
    allocation, engine_note = engine_of(values, environ)
    _default_instances(values, allocation)
    num_instances, num_replicas = _counts(values)
    hosts, host_counts, from_allocation = _hosts(values, num_instances, allocation)
    instance_args = tuple(
        _instance_args(text, num_instances) for text in values.get("instance_mpi_local_args", ())
    )
    only = values.get("only_output_from_instance")
    if only is not None:
        _check_instance("--only-output-from-instance", only, only, num_instances)
    for key in ("mpi_global_args", "mpi_local_args"):
        check_mpi_args(f"--{key.replace('_', '-')}", values.get(key, ()))
    for _, words in instance_args:
        check_mpi_args("--instance-mpi-local-args", words)
    if values.get("output_dir") is not None:
        check_output_dir("--output-dir", values["output_dir"], num_instances)
    if values.get("status_address") is not None and values.get("status_port") is None:
        raise PoprunError(
            "--status-address",
            values["status_address"],
            "has nothing to serve without --status-port",
            "add --status-port PORT (0 picks a free port), or leave --status-address out",
        )
    _check_time_limit(values, environ)
    _check_membership(values, hosts, allocation)
    # Remote-only runs cannot check the program here; the hosts must mirror local paths.
    if (require_program or program) and (not program or not hosts or any(map(is_local, hosts))):
        _check_program(program, environ)
    derived: dict[str, Any] = {
        "num_instances": num_instances,
        "num_replicas": num_replicas,
        "hosts": hosts,
        "host_counts": host_counts,
        "allocation": allocation,
        "hosts_from_allocation": from_allocation,
        "engine_note": engine_note,
        "instance_mpi_local_args": instance_args,
        "only_output_from_instance": only,
        "process_placement": _placement(values),
        "verbose": int(merged.get("verbose") or 0),
        "vipu": tuple((key, values[key]) for key in VIPU_OPTIONS if key in values),
    }
    # Every other option with a RunConfig field of its own name is stored as read.
    same = {k: v for k, v in values.items() if k in _FIELDS and k not in derived}
    return RunConfig(program=tuple(program), **derived, **same)
