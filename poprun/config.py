"""The run configuration: command-line values and an optional YAML file → one frozen RunConfig.

All validation happens here, before anything is launched. Each bad value raises a
:class:`~poprun.errors.PoprunError` naming the option, the value and the fix.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from poprun import userfile
from poprun.errors import PoprunError, read_user_file
from poprun.hosts import is_local, parse_host_file, parse_host_list

TRUE_WORDS = frozenset({"yes", "true", "1", "on", "y"})
FALSE_WORDS = frozenset({"no", "false", "0", "off", "n"})
BOOL_WORDS = TRUE_WORDS | FALSE_WORDS
PLACEMENTS = ("spreadnuma", "disabled")

#: PopRun's V-IPU options: accepted so existing command lines run, then ignored with a warning.
VIPU_OPTIONS: tuple[str, ...] = (
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

#: Options a YAML file may set (``--import-config``), in the order ``--export-config`` writes.
FILE_KEYS: tuple[str, ...] = (
    "num_instances",
    "num_replicas",
    "ipus_per_replica",
    "host",
    "host_file",
    "mpi_global_args",
    "mpi_local_args",
    "instance_mpi_local_args",
    "only_output_from_instance",
    "output_dir",
    "print_topology",
    "process_placement",
    "numa_aware",
    "offline_mode",
    "executable_cache_path",
    "host_subnet",
    "timeout",
    "allow_run_as_root",
    "use_default_allocator",
    *VIPU_OPTIONS,
)
LIST_KEYS = frozenset({"host", "mpi_global_args", "mpi_local_args", "instance_mpi_local_args"})


def option_name(key: str) -> str:
    """``num_replicas`` → ``--num-replicas``."""
    return "--" + key.replace("_", "-")


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs, validated. Frozen: later stages only read it."""

    program: tuple[str, ...] = ()
    num_instances: int = 1
    num_replicas: int = 1
    ipus_per_replica: int = 1
    hosts: tuple[str, ...] = ()
    mpi_global_args: tuple[str, ...] = ()
    mpi_local_args: tuple[str, ...] = ()
    instance_mpi_local_args: tuple[tuple[int, str], ...] = ()
    only_output_from_instance: int | None = None
    output_dir: str | None = None
    print_topology: bool = False
    dry_run: bool = False
    process_placement: str = "spreadnuma"
    offline_mode: bool = False
    executable_cache_path: str | None = None
    host_subnet: str | None = None
    timeout: float | None = None
    allow_run_as_root: bool = False
    use_default_allocator: bool = False
    verbose: int = 0
    vipu: tuple[tuple[str, str], ...] = ()

    @property
    def num_local_replicas(self) -> int:
        """Replicas of one instance."""
        return self.num_replicas // self.num_instances

    def global_args(self) -> list[str]:
        """``--mpi-global-args`` split shell-style, in order."""
        return [arg for text in self.mpi_global_args for arg in shlex.split(text)]

    def local_args(self, instance: int) -> list[str]:
        """``--mpi-local-args`` then this instance's ``--instance-mpi-local-args``."""
        out = [arg for text in self.mpi_local_args for arg in shlex.split(text)]
        for index, text in self.instance_mpi_local_args:
            if index == instance:
                out.extend(shlex.split(text))
        return out

    def to_file_values(self) -> dict[str, Any]:
        """The effective configuration as YAML-ready values (``--export-config``)."""
        out: dict[str, Any] = {
            "num-instances": self.num_instances,
            "num-replicas": self.num_replicas,
            "ipus-per-replica": self.ipus_per_replica,
        }
        if self.hosts:
            out["host"] = list(self.hosts)
        for key in ("mpi_global_args", "mpi_local_args"):
            if getattr(self, key):
                out[key.replace("_", "-")] = list(getattr(self, key))
        if self.instance_mpi_local_args:
            out["instance-mpi-local-args"] = [f"{i}:{t}" for i, t in self.instance_mpi_local_args]
        for key in ("only_output_from_instance", "output_dir", "executable_cache_path"):
            if getattr(self, key) is not None:
                out[key.replace("_", "-")] = getattr(self, key)
        out["print-topology"] = self.print_topology
        out["process-placement"] = self.process_placement
        out["offline-mode"] = self.offline_mode
        if self.host_subnet is not None:
            out["host-subnet"] = self.host_subnet
        if self.timeout is not None:
            out["timeout"] = self.timeout
        if self.allow_run_as_root:
            out["allow-run-as-root"] = True
        if self.use_default_allocator:
            out["use-default-allocator"] = True
        for key, value in self.vipu:
            out[key.replace("_", "-")] = value
        return out


# --- value parsers: each names the option, the value and the fix -----------------------------


def parse_bool(option: str, value: object) -> bool:
    """yes/no/true/false/1/0 (any case), or a YAML boolean."""
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


def _parse_timeout(value: object) -> float:
    option = "--timeout"
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
            "give a positive --timeout or leave it out",
        )
    return seconds


def _as_list(key: str, value: object) -> list[str]:
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple) else [value]
    for item in items:
        if isinstance(item, dict | list | tuple) or item is None:
            raise PoprunError(
                option_name(key),
                item,
                "must be a string or a list of strings",
                "fix the YAML value",
            )
    return [str(item) for item in items]


def _as_text(key: str, value: object) -> str:
    if isinstance(value, dict | list | tuple) or value is None:
        raise PoprunError(option_name(key), value, "must be a single value", "fix the YAML value")
    text = str(value)
    if not text.strip():
        raise PoprunError(
            option_name(key), repr(text), "is empty", f"give {option_name(key)} a value"
        )
    return text


def _check_shell_words(option: str, text: str) -> None:
    try:
        shlex.split(text)
    except ValueError as error:
        raise PoprunError(
            option, text, f"cannot be split into arguments ({error})", "balance the quotes"
        ) from None


def _parse_instance_local(text: str, num_instances: int) -> tuple[int, str]:
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
    if not 0 <= index < num_instances:
        raise PoprunError(
            option,
            text,
            f"instance {index} is out of range for --num-instances={num_instances}",
            f"use an index from 0 to {num_instances - 1}",
        )
    _check_shell_words(option, args)
    return index, args


def _parse_subnet(value: str) -> str:
    option = "--host-subnet"
    if "/" in value or value.replace(".", "").isdigit():
        import ipaddress  # only when the option is used

        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise PoprunError(
                option, value, "is not a subnet", "give CIDR notation (10.5.0.0/16) or an interface"
            ) from None
        return value
    if not value.replace("_", "").replace("-", "").replace(".", "").isalnum():
        raise PoprunError(
            option,
            value,
            "is neither a subnet nor an interface name",
            "give e.g. 10.5.0.0/16 or eth0",
        )
    return value


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
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise PoprunError(
                "program",
                name,
                "is not executable",
                f"chmod +x {name}, or run it through its interpreter (python {name})",
            )
    elif shutil.which(name, path=environ.get("PATH", os.defpath)) is None:
        raise PoprunError("program", name, "is not found on PATH", "give its path, or fix PATH")


def load_file(path: str) -> dict[str, Any]:
    """Read an ``--import-config`` YAML file (``safe_load``) into canonical keys."""
    option = "--import-config"
    text = read_user_file(option, path, "YAML file")
    import yaml  # only when a file is imported: keeps start-up light

    try:
        data = userfile.load_yaml(option, path, text)  # aliases counted: no anchor bombs
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PoprunError(
            option, path, f"is not valid YAML{where}", "fix the file's syntax"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PoprunError(
            option,
            path,
            "is not a mapping of option names to values",
            "write lines like 'num-replicas: 4'",
        )
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).strip().lstrip("-").replace("-", "_")
        if key not in FILE_KEYS:
            raise PoprunError(
                option,
                path,
                f"unknown key {raw_key!r}",
                "use poprun's option names (num-replicas, host, mpi-local-args, ...); see poprun --help",
            )
        out[key] = value
    return out


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
    given = {k: v for k, v in cli.items() if v is not None and v != [] and v != ()}
    merged: dict[str, Any] = dict(file_values or {})
    if "host" in given or "host_file" in given:
        merged.pop("host", None)
        merged.pop("host_file", None)
    merged.update(given)

    def get(key: str) -> Any:
        return merged.get(key)

    def flag(key: str) -> bool:
        """A boolean option: False when absent, else its yes/no/true/false/1/0 value."""
        return parse_bool("--" + key.replace("_", "-"), get(key)) if key in merged else False

    num_instances = (
        parse_count("--num-instances", get("num_instances")) if "num_instances" in merged else 1
    )
    num_replicas = (
        parse_count("--num-replicas", get("num_replicas")) if "num_replicas" in merged else 1
    )
    ipr = (
        parse_count("--ipus-per-replica", get("ipus_per_replica"))
        if "ipus_per_replica" in merged
        else 1
    )
    if num_instances > num_replicas:
        raise PoprunError(
            "--num-instances",
            num_instances,
            f"is more than --num-replicas={num_replicas}; every instance needs at least one replica",
            f"use --num-instances {num_replicas} or fewer, or raise --num-replicas",
        )
    if num_replicas % num_instances:
        lower = num_replicas - num_replicas % num_instances
        raise PoprunError(
            "--num-replicas",
            num_replicas,
            f"is not divisible by --num-instances={num_instances}",
            f"use a multiple of {num_instances} (e.g. {lower or num_instances} or {lower + num_instances})",
        )

    if "host" in merged and "host_file" in merged:
        raise PoprunError(
            "--host-file",
            get("host_file"),
            "conflicts with -H/--host",
            "give the hosts one way only",
        )
    hosts: tuple[str, ...] = ()
    if "host" in merged:
        hosts = parse_host_list(_as_list("host", get("host")))
    elif "host_file" in merged:
        hosts = parse_host_file(_as_text("host_file", get("host_file")))
    if hosts and num_instances % len(hosts):
        raise PoprunError(
            "--num-instances",
            num_instances,
            f"cannot be divided evenly over {len(hosts)} hosts ({', '.join(hosts)})",
            f"use a multiple of {len(hosts)} instances, or list fewer hosts",
        )

    global_args = _as_list("mpi_global_args", get("mpi_global_args"))
    local_args = _as_list("mpi_local_args", get("mpi_local_args"))
    for text in global_args:
        _check_shell_words("--mpi-global-args", text)
    for text in local_args:
        _check_shell_words("--mpi-local-args", text)
    instance_local = tuple(
        _parse_instance_local(text, num_instances)
        for text in _as_list("instance_mpi_local_args", get("instance_mpi_local_args"))
    )

    only = None
    if "only_output_from_instance" in merged:
        only = parse_count(
            "--only-output-from-instance", get("only_output_from_instance"), minimum=0
        )
        if only >= num_instances:
            raise PoprunError(
                "--only-output-from-instance",
                only,
                f"is out of range for --num-instances={num_instances}",
                f"use an instance index from 0 to {num_instances - 1}",
            )

    output_dir = None
    if "output_dir" in merged:
        output_dir = _as_text("output_dir", get("output_dir"))
        if os.path.exists(output_dir) and not os.path.isdir(output_dir):
            raise PoprunError(
                "--output-dir", output_dir, "exists and is not a directory", "give a directory path"
            )

    placement = "spreadnuma"
    if "process_placement" in merged:
        placement = _as_text("process_placement", get("process_placement")).strip().lower()
        if placement not in PLACEMENTS:
            raise PoprunError(
                "--process-placement",
                get("process_placement"),
                "is not a known placement",
                "use spreadnuma or disabled",
            )
    if "numa_aware" in merged:
        numa = parse_bool("--numa-aware", get("numa_aware"))
        implied = "spreadnuma" if numa else "disabled"
        if "process_placement" in merged and placement != implied:
            raise PoprunError(
                "--numa-aware",
                get("numa_aware"),
                f"conflicts with --process-placement={placement}",
                "give only --process-placement (--numa-aware is its older name)",
            )
        placement = implied

    cache = None
    if "executable_cache_path" in merged:
        cache = os.path.abspath(_as_text("executable_cache_path", get("executable_cache_path")))
        if os.path.exists(cache) and not os.path.isdir(cache):
            raise PoprunError(
                "--executable-cache-path",
                cache,
                "exists and is not a directory",
                "give a directory path",
            )

    subnet = (
        _parse_subnet(_as_text("host_subnet", get("host_subnet")))
        if "host_subnet" in merged
        else None
    )
    timeout = _parse_timeout(get("timeout")) if "timeout" in merged else None

    vipu = tuple((key, str(merged[key])) for key in VIPU_OPTIONS if key in merged)
    verbose = int(merged.get("verbose") or 0)

    # Remote-only runs cannot check the program here; the hosts must mirror local paths.
    if (require_program or program) and (not program or not hosts or any(map(is_local, hosts))):
        _check_program(program, environ)

    return RunConfig(
        program=tuple(program),
        num_instances=num_instances,
        num_replicas=num_replicas,
        ipus_per_replica=ipr,
        hosts=hosts,
        mpi_global_args=tuple(global_args),
        mpi_local_args=tuple(local_args),
        instance_mpi_local_args=instance_local,
        only_output_from_instance=only,
        output_dir=output_dir,
        print_topology=flag("print_topology"),
        dry_run=flag("dry_run"),
        process_placement=placement,
        offline_mode=flag("offline_mode"),
        executable_cache_path=cache,
        host_subnet=subnet,
        timeout=timeout,
        allow_run_as_root=flag("allow_run_as_root"),
        use_default_allocator=flag("use_default_allocator"),
        verbose=verbose,
        vipu=vipu,
    )


def export_file(config: RunConfig, path: str, *, overwrite: bool) -> None:
    """Write the effective configuration as YAML (refusing to overwrite unless told)."""
    import yaml

    text = yaml.safe_dump(config.to_file_values(), sort_keys=False, default_flow_style=False)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def check_export_path(path: str, *, overwrite: bool) -> None:
    """Refuse an ``--export-config`` target before anything happens."""
    option = "--export-config"
    if os.path.isdir(path):
        raise PoprunError(option, path, "is a directory", "give a file path")
    if os.path.exists(path) and not overwrite:
        raise PoprunError(
            option, path, "already exists", "choose another path or add --overwrite-config=yes"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise PoprunError(option, path, f"directory {parent} does not exist", "create it first")
