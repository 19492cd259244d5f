"""The ``poprun`` command line (PopRun's option names), built on typer from the option table.

Before typer sees the arguments, :func:`normalise` splits off the program (everything from
the first word that is not an option or an option's value) and gives yes/no options an
explicit value: PopRun accepts ``--offline-mode``, ``--offline-mode yes`` and
``--offline-mode=1`` alike. Both it and typer's command come from
:data:`poprun.config.options.OPTIONS`; typer's command (which imports pydantic, ~50 ms) is built
only for ``--help`` and ``--version``. Every value is then checked by :mod:`poprun.config.run_config`.
"""

from __future__ import annotations

import difflib
import inspect
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from poprun import __version__, log
from poprun.config.options import (
    BOOL_WORDS,
    BY_KEY,
    FLAGS,
    OPTIONS,
    option_name,
    parse_bool,
    spelling_table,
)
from poprun.errors import EXIT_USAGE, PoprunError

if TYPE_CHECKING:
    from poprun.config.run_config import RunConfig
    from poprun.plan.topology import Topology

HELP = (
    "Launch PROGRAM as --num-instances instances with mpirun, splitting --num-replicas "
    "replicas evenly over them (PopRun-compatible). Exit code: 0 when every instance "
    "succeeds; the first failing instance's code (128+N for signal N); 124 at --timeout; "
    "2 for a usage error (nothing launched)."
)


def _command(**values: Any) -> None:
    """Collect the options typer parsed; :func:`run` does the work."""
    program = values.pop("program")
    if values.pop("version"):
        sys.stdout.write(f"poprun {__version__} (PopRun-compatible launcher on Open MPI)\n")
        raise typer.Exit(0)
    if values.pop("vv"):
        values["verbose"] = max(values["verbose"], 2)
    raise typer.Exit(run(values, tuple(program or ())))


def _parameters() -> list[inspect.Parameter]:
    """typer's parameters for :func:`_command`, one per row of the option table."""

    def param(name: str, kind: Any, info: Any, default: Any = None) -> inspect.Parameter:
        return inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, info]
        )

    params = [
        param(
            "program",
            list[str] | None,
            typer.Argument(metavar="PROGRAM [ARGS]...", help="program and its arguments"),
        )
    ]
    for option in OPTIONS:
        info = typer.Option(
            *option.spellings,
            metavar=option.metavar,
            help=option.help or None,
            hidden=option.hidden,
        )
        params.append(param(option.key, list[str] | None if option.multiple else str | None, info))
    (verbose, verbose_help), (vv, vv_help), (version, version_help), _ = FLAGS
    params.append(param("verbose", int, typer.Option(*verbose, count=True, help=verbose_help), 0))
    params.append(param("vv", bool, typer.Option(*vv, help=vv_help), False))
    params.append(param("version", bool, typer.Option(*version, help=version_help), False))
    return params


def typer_app() -> typer.Typer:
    """The typer application (built only for ``--help``, ``--version`` and odd input)."""
    params = _parameters()
    _command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    _command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    app = typer.Typer(
        rich_markup_mode=None,
        add_completion=False,
        context_settings={
            "help_option_names": ["-h", "--help"],
            "allow_interspersed_args": False,
        },
    )
    app.command(help=HELP, no_args_is_help=False)(_command)
    return app


def run(
    values: dict[str, Any], program: tuple[str, ...], environ: dict[str, str] | None = None
) -> int:
    """Validate, plan and launch. Raises :class:`PoprunError` for bad input (nothing launched)."""
    from poprun.config import config_file
    from poprun.plan.devices import check_pool, device_pool
    from poprun.plan.environment import forwarded_names, mpirun_environment, with_allocator_defaults
    from poprun.plan.mpirun import build_argv, find_mpirun, mca_from_environment, quote
    from poprun.plan.topology import render

    environ = dict(os.environ if environ is None else environ)
    log.set_verbosity(int(values.get("verbose") or 0))
    export_path = values.pop("export_config", None)
    overwrite = parse_bool("--overwrite-config", values.pop("overwrite_config", None) or "no")
    config = _configure(values, program, environ, export_path, overwrite)
    mpirun = find_mpirun(environ)
    environ = with_allocator_defaults(config, environ)

    topology, numactl = _plan(config, environ)
    pool = device_pool(environ)
    check_pool(topology, pool)
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
        names = ", ".join(option_name(k) for k, _ in config.vipu)
        log.warning(f"there is no V-IPU here: ignoring {names}")
    if export_path:
        config_file.export_file(config, export_path, overwrite=overwrite)
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
    return _launch(config, topology, argv, mpirun_environment(config, environ))


def _launch(config: RunConfig, topology: Topology, argv: list[str], env: dict[str, str]) -> int:
    """The ssh check (its connections kept for mpirun), then the supervised job."""
    from poprun.plan.hosts import is_local
    from poprun.run.supervisor import supervise

    remote = [host for host in topology.hosts if not is_local(host)]
    shared = None
    if remote and config.ssh_check:
        from poprun.run import ssh_check

        shared = ssh_check.check(remote, config.global_args(), env)
    try:
        return supervise(config, topology, argv, {**env, **(shared.env() if shared else {})})
    finally:
        if shared is not None:
            shared.close()


def _configure(
    values: dict[str, Any],
    program: tuple[str, ...],
    environ: dict[str, str],
    export_path: str | None,
    overwrite: bool,
) -> RunConfig:
    """The run's configuration: the YAML file's values under the command line's, validated."""
    from poprun.config import config_file, run_config

    import_path = values.pop("import_config", None)
    file_values = config_file.load_file(import_path) if import_path else None
    if export_path:
        config_file.check_export_path(export_path, overwrite=overwrite)
    return run_config.build(
        values, program, environ, file_values=file_values, require_program=not export_path
    )


def _plan(config: RunConfig, environ: dict[str, str]) -> tuple[Topology, str | None]:
    """The topology (NUMA nodes measured here, assumed alike on other hosts) and numactl."""
    from poprun.plan.topology import local_numa_node_count, plan

    numa = {}
    if config.process_placement == "spreadnuma":
        nodes = local_numa_node_count()
        if nodes == 1:
            log.info("process placement: this host has one NUMA node, so there is nothing to bind")
        numa = {host: nodes for host in (config.hosts or ("localhost",))}
    topology = plan(config, numa)
    numactl = None
    if any(p.numa_nodes for p in topology.instances):
        import shutil

        numactl = shutil.which("numactl", path=environ.get("PATH"))
        if numactl is None:
            log.warning("numactl is not on PATH: instances are not bound to NUMA nodes")
    return topology, numactl


def _fast_values(options: list[str]) -> dict[str, Any] | None:
    """The option values without click (start-up speed); None when click must handle it."""
    values: dict[str, Any] = {}
    for option in options:
        name, _, value = option.partition("=")
        if name in ("--help", "--version"):
            return None
        if name in ("-v", "--verbose"):
            values["verbose"] = values.get("verbose", 0) + 1
        elif name == "--vv":
            values["verbose"] = max(values.get("verbose", 0), 2)
        else:
            key = name[2:].replace("-", "_")
            if BY_KEY[key].multiple:
                values.setdefault(key, []).append(value)
            else:
                values[key] = value
    return values


#: mpirun's spellings users reach for, and poprun's options that do the job.
_MPIRUN_SPELLINGS = {
    **dict.fromkeys(("-np", "--np", "-n", "-c"), "--num-instances (and --num-replicas)"),
    **dict.fromkeys(("--hostfile", "-hostfile", "--machinefile", "-machinefile"), "--host-file"),
    "-host": "-H/--host",
}


def normalise(args: list[str]) -> tuple[list[str], list[str]]:
    """Split ``args`` into (options in ``--name=value`` form, program and its arguments)."""
    table = spelling_table()
    yes_no = {option.name for option in OPTIONS if option.yes_no}
    options: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--":
            return options, args[i + 1 :]
        if not token.startswith("-") or token == "-":
            return options, args[i:]
        mpirun_word = token.partition("=")[0]
        if mpirun_word in _MPIRUN_SPELLINGS:
            raise PoprunError(
                mpirun_word,
                None,
                "is mpirun's option, not poprun's",
                f"use {_MPIRUN_SPELLINGS[mpirun_word]}",
            )
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
            options.append(long_name)
            i += 1
            continue
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if long_name in yes_no:
                if nxt is not None and nxt.lower() in BOOL_WORDS:
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

    if argv is None:  # the real command: closed or vanishing standard streams are no error
        from poprun.run.output import console

        console.install()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options, program = normalise(args)
        values = _fast_values(options)
        if values is not None:
            return run(values, tuple(program))
        command_ = typer.main.get_command(typer_app())
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
