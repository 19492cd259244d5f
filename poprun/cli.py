"""The ``poprun`` command line (PopRun's option names), built on typer.

Before typer sees the arguments, :func:`normalise` splits off the program (everything from
the first word that is not an option or an option's value) and gives boolean options an
explicit value: PopRun accepts ``--offline-mode``, ``--offline-mode yes`` and
``--offline-mode=1`` alike. Every value is then checked by :mod:`poprun.config`.
"""

from __future__ import annotations

import difflib
import os
import sys
from typing import Annotated, Any

import typer

from poprun import __version__, log
from poprun.errors import EXIT_USAGE, PoprunError

BOOL_OPTIONS = frozenset(
    {
        "--print-topology",
        "--offline-mode",
        "--numa-aware",
        "--update-partition",
        "--reset-partition",
        "--remove-partition",
        "--overwrite-config",
        "--allow-run-as-root",
        "--dry-run",
        "--use-default-allocator",
    }
)
_BOOL_WORDS = frozenset({"yes", "no", "true", "false", "1", "0"})

app = typer.Typer(
    rich_markup_mode=None,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"], "allow_interspersed_args": False},
)

Text = Annotated[str | None, typer.Option()]
Bool = Annotated[str | None, typer.Option(metavar="[yes|no]")]


@app.command(
    help=(
        "Launch PROGRAM as --num-instances instances with mpirun, splitting --num-replicas "
        "replicas evenly over them (PopRun-compatible). Exit code: 0 when every instance "
        "succeeds; the first failing instance's code (128+N for signal N); 124 at --timeout; "
        "2 for a usage error (nothing launched)."
    ),
    no_args_is_help=False,
)
def command(
    program: Annotated[
        list[str] | None,
        typer.Argument(metavar="PROGRAM [ARGS]...", help="program and its arguments"),
    ] = None,
    num_instances: Annotated[
        str | None, typer.Option(metavar="N", help="instances (processes) [1]")
    ] = None,
    num_replicas: Annotated[
        str | None, typer.Option(metavar="N", help="replicas over all instances [1]")
    ] = None,
    ipus_per_replica: Annotated[
        str | None, typer.Option(metavar="N", help="devices per replica [1]")
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option("-H", "--host", metavar="HOSTS", help="hosts: a,b or node[0-3,5]"),
    ] = None,
    host_file: Annotated[
        str | None, typer.Option(metavar="FILE", help="file with one host a line")
    ] = None,
    mpi_global_args: Annotated[
        list[str] | None,
        typer.Option(metavar="ARGS", help="mpirun options before the instances (repeatable)"),
    ] = None,
    mpi_local_args: Annotated[
        list[str] | None, typer.Option(metavar="ARGS", help="mpirun options for every instance")
    ] = None,
    instance_mpi_local_args: Annotated[
        list[str] | None,
        typer.Option(metavar="IDX:ARGS", help="mpirun options for one instance (repeatable)"),
    ] = None,
    only_output_from_instance: Annotated[
        str | None,
        typer.Option(metavar="N", help="show only this instance's output on the console"),
    ] = None,
    output_dir: Annotated[
        str | None, typer.Option(metavar="DIR", help="write instance-<i>.stdout/.stderr files here")
    ] = None,
    print_topology: Annotated[str | None, typer.Option(metavar="[yes|no]")] = None,
    dry_run: Annotated[
        str | None, typer.Option(metavar="[yes|no]", help="print the mpirun argv; launch nothing")
    ] = None,
    process_placement: Annotated[
        str | None,
        typer.Option(
            metavar="spreadnuma|disabled", help="bind instances to NUMA nodes [spreadnuma]"
        ),
    ] = None,
    numa_aware: Annotated[
        str | None, typer.Option(metavar="[yes|no]", help="older name of --process-placement")
    ] = None,
    offline_mode: Annotated[
        str | None, typer.Option(metavar="[yes|no]", help="run on CPU, no accelerators")
    ] = None,
    executable_cache_path: Annotated[
        str | None, typer.Option(metavar="DIR", help="compilation cache directory (exported)")
    ] = None,
    import_config: Annotated[
        str | None, typer.Option(metavar="FILE", help="read options from YAML")
    ] = None,
    export_config: Annotated[
        str | None, typer.Option(metavar="FILE", help="write the effective options as YAML")
    ] = None,
    overwrite_config: Annotated[str | None, typer.Option(metavar="[yes|no]")] = None,
    host_subnet: Annotated[
        str | None, typer.Option(metavar="CIDR", help="subnet or interface for MPI traffic")
    ] = None,
    timeout: Annotated[
        str | None, typer.Option(metavar="SECONDS", help="end the job after SECONDS (exit 124)")
    ] = None,
    allow_run_as_root: Annotated[str | None, typer.Option(metavar="[yes|no]")] = None,
    use_default_allocator: Annotated[
        str | None,
        typer.Option(
            metavar="[yes|no]",
            help="leave glibc malloc at its defaults (poprun keeps freed memory in each instance)",
        ),
    ] = None,
    vipu_server_host: Annotated[str | None, typer.Option(hidden=True)] = None,
    vipu_server_port: Annotated[str | None, typer.Option(hidden=True)] = None,
    vipu_server_timeout: Annotated[str | None, typer.Option(hidden=True)] = None,
    vipu_partition: Annotated[str | None, typer.Option(hidden=True)] = None,
    vipu_partition_attempts: Annotated[str | None, typer.Option(hidden=True)] = None,
    vipu_allocation: Annotated[str | None, typer.Option(hidden=True)] = None,
    vipu_cluster: Annotated[str | None, typer.Option(hidden=True)] = None,
    update_partition: Annotated[str | None, typer.Option(hidden=True)] = None,
    reset_partition: Annotated[str | None, typer.Option(hidden=True)] = None,
    remove_partition: Annotated[str | None, typer.Option(hidden=True)] = None,
    num_ilds: Annotated[str | None, typer.Option(hidden=True)] = None,
    sync_type: Annotated[str | None, typer.Option(hidden=True)] = None,
    verbose: Annotated[int, typer.Option("-v", "--verbose", count=True, help="-v, -vv")] = 0,
    vv: Annotated[bool, typer.Option("--vv", help="same as -vv")] = False,
    version: Annotated[bool, typer.Option("--version", help="print the version")] = False,
) -> None:
    """Collect the options; :func:`run` does the work."""
    values = dict(locals())
    values.pop("program")
    if values.pop("version"):
        sys.stdout.write(f"poprun {__version__} (PopRun-compatible launcher on Open MPI)\n")
        raise typer.Exit(0)
    if values.pop("vv"):
        values["verbose"] = max(values["verbose"], 2)
    raise typer.Exit(run(values, tuple(program or ())))


def run(
    values: dict[str, Any], program: tuple[str, ...], environ: dict[str, str] | None = None
) -> int:
    """Validate, plan and launch. Raises :class:`PoprunError` for bad input (nothing launched)."""
    from poprun import config as cfg
    from poprun.devices import check_pool, device_pool
    from poprun.environment import forwarded_names, mpirun_environment, with_allocator_defaults
    from poprun.mpirun import build_argv, find_mpirun, mca_from_environment, quote
    from poprun.topology import local_numa_node_count, plan, render

    environ = dict(os.environ if environ is None else environ)
    log.set_verbosity(int(values.get("verbose") or 0))
    import_path = values.pop("import_config", None)
    export_path = values.pop("export_config", None)
    overwrite = cfg.parse_bool("--overwrite-config", values.pop("overwrite_config", None) or "no")
    file_values = cfg.load_file(import_path) if import_path else None
    if export_path:
        cfg.check_export_path(export_path, overwrite=overwrite)
    config = cfg.build(
        values, program, environ, file_values=file_values, require_program=not export_path
    )
    mpirun = find_mpirun(environ)
    environ = with_allocator_defaults(config, environ)

    numa = {}
    if config.process_placement == "spreadnuma":
        nodes = local_numa_node_count()
        if nodes == 1:
            log.info("process placement: this host has one NUMA node, so there is nothing to bind")
        numa = {host: nodes for host in (config.hosts or ("localhost",))}
    topology = plan(config, numa)
    pool = device_pool(environ)
    check_pool(topology, pool)
    numactl = None
    if any(p.numa_nodes for p in topology.instances):
        import shutil

        numactl = shutil.which("numactl", path=environ.get("PATH"))
        if numactl is None:
            log.warning("numactl is not on PATH: instances are not bound to NUMA nodes")
    argv = build_argv(
        config,
        topology,
        mpirun=mpirun,
        forwarded=forwarded_names(environ),
        is_root=os.geteuid() == 0,
        local_cpus=len(os.sched_getaffinity(0)),
        numactl=numactl,
        user_mca=mca_from_environment(environ),
        device_pool=pool,
    )
    if config.vipu:
        names = ", ".join(cfg.option_name(k) for k, _ in config.vipu)
        log.warning(f"there is no V-IPU here: ignoring {names}")
    if export_path:
        cfg.export_file(config, export_path, overwrite=overwrite)
        log.info(f"wrote the configuration to {export_path}")
        if not config.program:
            return 0
    if config.print_topology:
        sys.stdout.write(render(topology) + "\n")
        sys.stdout.flush()
    log.info(f"Running command: {quote(argv)}")
    if config.dry_run:
        sys.stdout.write(quote(argv) + "\n")
        return 0
    from poprun.supervisor import Supervisor

    return Supervisor(config, topology, argv, mpirun_environment(config, environ)).run()


_MULTIPLE = frozenset({"host", "mpi_global_args", "mpi_local_args", "instance_mpi_local_args"})


def _option_table() -> dict[str, tuple[bool, str]]:
    """Every option name → (whether it takes a value, its long name).

    Read from :func:`command`'s signature, not from the click command typer would build:
    building that imports pydantic (~50 ms), which only ``--help`` needs.
    """
    import inspect
    import typing

    table: dict[str, tuple[bool, str]] = {"-h": (False, "--help"), "--help": (False, "--help")}
    hints = typing.get_type_hints(command, include_extras=True)
    for name, parameter in inspect.signature(command).parameters.items():
        info = next(
            (m for m in getattr(hints[name], "__metadata__", ()) if hasattr(m, "param_decls")), None
        )
        if info is None or isinstance(info, typer.models.ArgumentInfo):
            continue
        decls = list(info.param_decls or ())
        if isinstance(info.default, str) and info.default.startswith("-"):
            decls.insert(0, info.default)  # typer.Option("-H", "--host"): the first is a name
        decls = decls or ["--" + name.replace("_", "-")]
        takes_value = parameter.default is None
        long_name = next((d for d in decls if d.startswith("--")), decls[0])
        for decl in decls:
            table[decl] = (takes_value, long_name)
    return table


def _fast_values(options: list[str]) -> dict[str, Any] | None:
    """The option values without click (start-up speed); None when click must handle it."""
    values: dict[str, Any] = {}
    for option in options:
        name, _, value = option.partition("=")
        if name in ("--help", "--version"):
            return None
        if name == "-v":
            values["verbose"] = values.get("verbose", 0) + 1
        elif name == "--vv":
            values["verbose"] = max(values.get("verbose", 0), 2)
        else:
            key = name[2:].replace("-", "_")
            if key in _MULTIPLE:
                values.setdefault(key, []).append(value)
            else:
                values[key] = value
    return values


def normalise(args: list[str]) -> tuple[list[str], list[str]]:
    """Split ``args`` into (options in ``--name=value`` form, program and its arguments)."""
    table = _option_table()
    options: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return options, args[i + 1 :]
        if not token.startswith("-") or token == "-":
            return options, args[i:]
        if token.startswith("--"):
            name, eq, value = token.partition("=")
        elif len(token) > 2 and token[1] != "v":
            name, eq, value = token[:2], "=", token[2:]  # -Hnode0
        else:
            name, eq, value = token, "", ""
        if set(token[1:]) == {"v"}:  # -v, -vv, -vvv
            options.extend(["-v"] * (len(token) - 1))
            i += 1
            continue
        if name not in table:
            close = difflib.get_close_matches(name, [n for n in table if n.startswith("--")], 1)
            hint = f"did you mean {close[0]}?" if close else "see poprun --help"
            raise PoprunError(name, None, "is not a poprun option", hint)
        takes_value, long_name = table[name]
        if not takes_value:
            if eq:
                raise PoprunError(name, value, "takes no value", f"write just {name}")
            options.append(name)
            i += 1
            continue
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if name in BOOL_OPTIONS:
                if nxt is not None and nxt.lower() in _BOOL_WORDS:
                    value = nxt
                    i += 1
                else:
                    value = "yes"
            elif nxt is None:
                raise PoprunError(name, None, "needs a value", f"write {name}=VALUE")
            else:
                value = nxt
                i += 1
        options.append(f"{long_name}={value}")
        i += 1
    return options, []


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``poprun`` console script."""
    import typer.main
    from typer._click.exceptions import ClickException
    from typer.exceptions import Exit

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options, program = normalise(args)
        values = _fast_values(options)
        if values is not None:
            return run(values, tuple(program))
        command_ = typer.main.get_command(app)
        result = command_.main(
            [*options, "--", *program], prog_name="poprun", standalone_mode=False
        )
        return int(result or 0)
    except Exit as done:
        return int(done.exit_code)
    except PoprunError as error:
        sys.stderr.write(f"poprun: error: {error}\n")
        return EXIT_USAGE
    except ClickException as error:
        sys.stderr.write(f"poprun: error: {error.format_message()}; fix: see poprun --help\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
