"""poprun's options, declared once: the table that drives the CLI, YAML and validation.

Each :class:`Option` row says how the option is spelled, whether it takes a value, how its
value is read and checked (one parser per kind, each error naming the option, the value and
the fix), whether a YAML file may set it and how ``--export-config`` writes it back. The
command line (:mod:`poprun.cli`: typer's command and the fast pre-parser are both generated
from :data:`OPTIONS`), the YAML import and export and the yes/no words all read this table,
so an option added here is everywhere at once. Rules between options (replicas divisible by
instances, hosts dividing instances, ...) are in :mod:`poprun.config.run_config`.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from typing import Any, NamedTuple

from popdist import env as contract
from poprun.errors import PoprunError

#: The words a yes/no option accepts (any case), on the command line and in YAML.
TRUE_WORDS = frozenset({"yes", "true", "1", "on", "y"})
FALSE_WORDS = frozenset({"no", "false", "0", "off", "n"})
BOOL_WORDS = TRUE_WORDS | FALSE_WORDS
PLACEMENTS = ("spreadnuma", "disabled")
#: What ``--hang-timeout`` does when it passes (``--on-hang``); the first is the default.
HANG_ACTIONS = ("kill", "report")

Parser = Callable[[str, object], Any]


def option_name(key: str) -> str:
    """``num_replicas`` → ``--num-replicas``."""
    return "--" + key.replace("_", "-")


# --- value parsers: each names the option, the value and the fix -----------------------------


def parse_bool(option: str, value: object) -> bool:
    """yes/no/true/false/on/off/y/n/1/0 (any case), or a YAML boolean."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise PoprunError(option, value, "is not a yes/no value", f"write {option}=yes or {option}=no")


def parse_count(option: str, value: object, *, minimum: int = 1) -> int:
    """A whole number of at least ``minimum``."""
    if isinstance(value, (bool, float | list | dict)):
        number = None
    elif isinstance(value, int):
        number = value
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            number = None
    if number is None:
        raise PoprunError(option, value, "is not a whole number", f"give {option} an integer")
    if number < minimum:
        what = "positive" if minimum == 1 else f"at least {minimum}"
        raise PoprunError(
            option, value, f"must be {what}", f"give {option} {max(minimum, 1)} or more"
        )
    return number


def parse_index(option: str, value: object) -> int:
    """A whole number from 0 (an instance index)."""
    return parse_count(option, value, minimum=0)


def parse_text(option: str, value: object) -> str:
    """One non-empty value (not a YAML list or mapping)."""
    if isinstance(value, dict | list | tuple) or value is None:
        raise PoprunError(option, value, "must be a single value", "fix the YAML value")
    text = str(value)
    if not text.strip():
        raise PoprunError(option, repr(text), "is empty", f"give {option} a value")
    return text


def parse_list(option: str, value: object) -> list[str]:
    """A repeatable option: a value or a YAML list of them."""
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple) else [value]
    for item in items:
        if isinstance(item, dict | list | tuple) or item is None:
            raise PoprunError(
                option, item, "must be a string or a list of strings", "fix the YAML value"
            )
    return [str(item) for item in items]


def split_words(option: str, text: str) -> list[str]:
    """``text`` split shell-style into arguments."""
    try:
        return shlex.split(text)
    except ValueError as error:
        raise PoprunError(
            option, text, f"cannot be split into arguments ({error})", "balance the quotes"
        ) from None


def parse_args(option: str, value: object) -> tuple[str, ...]:
    """Repeatable mpirun arguments, each value split shell-style, all in order."""
    return tuple(word for text in parse_list(option, value) for word in split_words(option, text))


def parse_choice(choices: tuple[str, ...]) -> Parser:
    """A parser for one of ``choices`` (any case)."""

    def parse(option: str, value: object) -> str:
        text = parse_text(option, value).strip().lower()
        if text not in choices:
            raise PoprunError(
                option, value, "is not one of the choices", f"use {' or '.join(choices)}"
            )
        return text

    return parse


#: ``--ssh-wait``'s default: a Kubernetes MPIJob's launcher starts beside its workers
#: (``launcherCreationPolicy: AtStartup``), whose sshd and cluster-DNS records come up
#: seconds later.
SSH_WAIT_S = 60.0


def parse_wait(option: str, value: object) -> float:
    """A number of seconds to wait, 0 included (no wait)."""
    try:
        if float(str(value).strip()) == 0:
            return 0.0
    except ValueError:
        pass  # parse_seconds names the value and the fix
    return parse_seconds(option, value)


def parse_seconds(option: str, value: object) -> float:
    """A positive, finite number of seconds (any length: the supervisor waits in steps)."""
    try:
        seconds = float(str(value).strip()) if not isinstance(value, bool) else float("nan")
    except ValueError:
        seconds = float("nan")
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        raise PoprunError(option, value, "is not a number of seconds", "give e.g. --timeout 600")
    if seconds <= 0:
        raise PoprunError(
            option,
            value,
            "must be more than 0 seconds",
            f"give a positive {option} or leave it out",
        )
    return seconds


def parse_port(option: str, value: object) -> int:
    """A TCP port, 0 to 65535 (0: the system picks a free one)."""
    port = parse_count(option, value, minimum=0)
    if port > 65535:
        raise PoprunError(option, value, "is not a TCP port", f"give {option} 0 to 65535")
    return port


def parse_directory(option: str, value: object) -> str:
    """A directory path (it may not exist yet, but must not be a file)."""
    path = parse_text(option, value)
    if os.path.exists(path) and not os.path.isdir(path):
        raise PoprunError(option, path, "exists and is not a directory", "give a directory path")
    return path


def parse_absolute_directory(option: str, value: object) -> str:
    """:func:`parse_directory`, made absolute (instances may start elsewhere)."""
    return parse_directory(option, os.path.abspath(parse_text(option, value)))


def parse_subnet(option: str, value: object) -> str:
    """A subnet in CIDR notation or an interface name."""
    text = parse_text(option, value)
    if "/" in text or text.replace(".", "").isdigit():
        import ipaddress  # only when the option is used

        try:
            ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise PoprunError(
                option, text, "is not a subnet", "give CIDR notation (10.5.0.0/16) or an interface"
            ) from None
        return text
    if not text.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise PoprunError(
            option,
            text,
            "is neither a subnet nor an interface name",
            "give e.g. 10.5.0.0/16 or eth0",
        )
    return text


def parse_raw(option: str, value: object) -> str:
    """Any single value, kept as text (the V-IPU options, which are ignored)."""
    return str(value)


# --- the table -----------------------------------------------------------------------------------


class Option(NamedTuple):
    """One poprun option."""

    key: str  #: canonical key: the YAML key with ``_``, the typer parameter name
    parse: Parser  #: value → checked value (raises :class:`PoprunError`)
    metavar: str = "VALUE"
    help: str = ""
    short: str | None = None  #: a one-letter spelling (``-H``)
    hidden: bool = False  #: accepted, not shown by ``--help``
    yes_no: bool = False  #: a yes/no option: given alone it means yes
    multiple: bool = False  #: repeatable: values collect into a list
    in_file: bool = True  #: a YAML file may set it (``--import-config``)
    #: ``--export-config``: the RunConfig attribute written back ("" = not written), and whether
    #: it is written even at its default.
    attribute: str = ""
    always: bool = False
    dump: Callable[[Any], Any] | None = None  #: field value → YAML value

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every way to write it: ``("-H", "--host")``."""
        return (self.name,) if self.short is None else (self.short, self.name)

    @property
    def name(self) -> str:
        """The long spelling, ``--num-replicas``."""
        return option_name(self.key)

    def read(self, value: object) -> Any:
        """The checked value of this option."""
        return self.parse(self.name, value)


def _count(key: str, help_: str, **kw: Any) -> Option:
    return Option(key, parse_count, "N", help_, attribute=key, **kw)


def _yes_no(key: str, help_: str = "", **kw: Any) -> Option:
    kw.setdefault("attribute", key)
    return Option(key, parse_bool, "[yes|no]", help_, yes_no=True, **kw)


def _args(key: str, metavar: str, help_: str) -> Option:
    return Option(key, parse_args, metavar, help_, multiple=True, attribute=key, dump=_dump_args)


def _dump_args(words: tuple[str, ...]) -> list[str]:
    return [shlex.join(words)]


def _dump_instance_args(items: tuple[tuple[int, tuple[str, ...]], ...]) -> list[str]:
    return [f"{index}:{shlex.join(words)}" for index, words in items]


def _vipu(key: str) -> Option:
    yes_no = key.endswith("_partition") and not key.startswith("vipu")
    return Option(key, parse_raw, hidden=True, yes_no=yes_no)


#: Every option, in the order ``--help`` lists them and ``--export-config`` writes them.
OPTIONS: tuple[Option, ...] = (
    _count("num_instances", "instances (processes) [1]", always=True),
    _count("num_replicas", "replicas over all instances [1]", always=True),
    _count("ipus_per_replica", "devices per replica [1]", always=True),
    Option(
        "host",
        parse_list,
        "HOSTS",
        "hosts: a,b or node[0-3,5]",
        short="-H",
        multiple=True,
        attribute="hosts",
        dump=list,
    ),
    Option("host_file", parse_text, "FILE", "file with a host a line (Open MPI's slots= too)"),
    _args("mpi_global_args", "ARGS", "mpirun options before the instances (repeatable)"),
    _args("mpi_local_args", "ARGS", "mpirun options for every instance"),
    Option(
        "instance_mpi_local_args",
        parse_list,
        "IDX:ARGS",
        "mpirun options for one instance (repeatable)",
        multiple=True,
        attribute="instance_mpi_local_args",
        dump=_dump_instance_args,
    ),
    Option(
        "only_output_from_instance",
        parse_index,
        "N",
        "show only this instance's output on the console",
        attribute="only_output_from_instance",
    ),
    Option(
        "output_dir",
        parse_directory,
        "DIR",
        "write instance-<i>.stdout/.stderr files here",
        attribute="output_dir",
    ),
    _yes_no("print_topology", "print the hosts, instances, replicas and devices", always=True),
    _yes_no("dry_run", "print the mpirun argv; launch nothing", in_file=False, attribute=""),
    Option(
        "process_placement",
        parse_choice(PLACEMENTS),
        "spreadnuma|disabled",
        "bind instances to NUMA nodes [spreadnuma]",
        attribute="process_placement",
        always=True,
    ),
    _yes_no("numa_aware", "older name of --process-placement", attribute=""),
    _yes_no("offline_mode", "run on CPU, no accelerators", always=True),
    Option(
        "backend",
        parse_choice(contract.BACKENDS),
        "|".join(contract.BACKENDS),
        f"collectives backend of the instances [{contract.BACKENDS[0]}]",
        attribute="backend",
        always=True,
    ),
    _yes_no(
        "poptorch_modules",
        "the program's `import poptorch` and `import popart` answer with popdist_torch: a "
        "PopTorch program runs unchanged (exported as POPDIST_POPTORCH_MODULES=1)",
    ),
    _yes_no(
        "deterministic_reduction",
        "sum gradients over replicas in global replica order: the same weights, bit for bit, "
        "whatever the split over instances (slower; exported)",
    ),
    Option(
        "executable_cache_path",
        parse_absolute_directory,
        "DIR",
        "compilation cache directory (exported)",
        attribute="executable_cache_path",
    ),
    Option("import_config", parse_text, "FILE", "read options from YAML", in_file=False),
    Option(
        "export_config", parse_text, "FILE", "write the effective options as YAML", in_file=False
    ),
    _yes_no("overwrite_config", "let --export-config replace a file", in_file=False, attribute=""),
    Option(
        "host_subnet",
        parse_subnet,
        "CIDR",
        "subnet or interface for MPI traffic",
        attribute="host_subnet",
    ),
    Option(
        "timeout",
        parse_seconds,
        "SECONDS",
        "end the job after SECONDS (exit 124)",
        attribute="timeout",
    ),
    Option(
        "max_restarts",
        parse_index,
        "N",
        "relaunch the whole job up to N times after an instance fails (resume from a checkpoint)",
        attribute="max_restarts",
    ),
    _count(
        "min_hosts",
        "when hosts are lost and at least N remain, launch the job again on the rest: the "
        "same replicas, more on each instance (see docs/elastic.md; exit 69 below N)",
    ),
    _yes_no(
        "readmit",
        "with --min-hosts: a lost host that answers again rejoins at the next checkpoint",
    ),
    Option(
        "hang_timeout",
        parse_seconds,
        "SECONDS",
        "call the job hung when no instance made progress for SECONDS: say where each "
        "instance is and end the job (exit 124)",
        attribute="hang_timeout",
    ),
    Option(
        "on_hang",
        parse_choice(HANG_ACTIONS),
        "|".join(HANG_ACTIONS),
        f"what --hang-timeout does: end the job, or only report [{HANG_ACTIONS[0]}]",
        attribute="on_hang",
    ),
    Option(
        "status_port",
        parse_port,
        "PORT",
        "serve the job's live figures on http://127.0.0.1:PORT/metrics (Prometheus) and "
        "/status (JSON); 0 picks a free port",
        attribute="status_port",
    ),
    Option(
        "status_address",
        parse_text,
        "ADDRESS",
        "the address --status-port listens on [127.0.0.1]",
        attribute="status_address",
    ),
    Option(
        "time_limit_margin",
        parse_seconds,
        "SECONDS",
        "tell the instances to save this long before the Slurm job's end (or --timeout); "
        "then exit 75",
        attribute="time_limit_margin",
    ),
    Option(
        "sigterm_grace",
        parse_seconds,
        "SECONDS",
        "on SIGTERM (a pod deleted, a PBS or LSF job ended), tell the instances to save first; "
        "forward SIGTERM only if the job still runs this long after",
        attribute="sigterm_grace",
    ),
    _yes_no(
        "requeue_on_timeout",
        "in a Slurm job: requeue it (scontrol requeue) when it ends at its time limit",
    ),
    _yes_no("allow_run_as_root", "let mpirun run as root"),
    _yes_no(
        "use_default_allocator",
        "leave glibc malloc at its defaults (poprun keeps freed memory in each instance and "
        "backs its heap with 2 MB pages)",
    ),
    _yes_no(
        "ssh_check",
        "before launching on other hosts, check each answers ssh [yes]",
        in_file=False,
        attribute="",
    ),
    Option(
        "ssh_wait",
        parse_wait,
        "SECONDS",
        "how long the ssh check tries again a host that does not answer yet (its sshd or "
        f"name not up yet, as in a Kubernetes MPIJob) [{SSH_WAIT_S:g}]; 0: once",
        attribute="ssh_wait",
    ),
    *(
        _vipu(key)
        for key in (
            "vipu_server_host",
            "vipu_server_port",
            "vipu_server_timeout",
            "vipu_partition",
            "vipu_partition_attempts",
            "vipu_allocation",
            "vipu_cluster",
            "update_partition",
            "reset_partition",
            "remove_partition",
            "num_ilds",
            "sync_type",
        )
    ),
)
BY_KEY: dict[str, Option] = {option.key: option for option in OPTIONS}
#: PopRun's V-IPU options: accepted so existing command lines run, then ignored with a warning.
VIPU_OPTIONS: tuple[str, ...] = tuple(o.key for o in OPTIONS if o.hidden)
#: The keys a YAML file may set.
FILE_KEYS: tuple[str, ...] = tuple(o.key for o in OPTIONS if o.in_file)

#: Options that take no value: (spellings, help). ``-v`` counts.
FLAGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("-v", "--verbose"), "-v, -vv"),
    (("--vv",), "same as -vv"),
    (("--version",), "print the version"),
    (("-h", "--help"), "show this message"),
    (
        ("--check-build",),
        "print what this installation can run (versions, backends, GPUs, Slurm, ssh); "
        "exit 0 when a job can run",
    ),
)


def spelling_table() -> dict[str, tuple[bool, str]]:
    """Every spelling → (whether it takes a value, its long name)."""
    table: dict[str, tuple[bool, str]] = {}
    for option in OPTIONS:
        for spelling in option.spellings:
            table[spelling] = (True, option.name)
    for spellings, _ in FLAGS:
        for spelling in spellings:
            table[spelling] = (False, spellings[-1])
    return table
