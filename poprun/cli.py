"""The ``poprun`` command line: arguments in, exit code out.

:func:`main` installs poprun's signal handlers before anything else that takes time (see
:mod:`poprun.run.signals`), so a signal at any moment after that ends poprun with 128+N,
never by the signal itself; called in-process, it puts the caller's handlers back on every
path. Before typer sees the arguments, :func:`normalise` splits off the program (everything
from the first word that is not an option or an option's value) and gives yes/no options an
explicit value: PopRun accepts ``--offline-mode``, ``--offline-mode yes`` and
``--offline-mode=1`` alike. Both it and typer's command (:mod:`poprun.config.command`, built
only for ``--help``, ``--version`` and odd input) come from
:data:`poprun.config.options.OPTIONS`. Every value is then checked by
:mod:`poprun.config.run_config`; :func:`run` plans and launches.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from popdist.env import local_cores
from poprun import log
from poprun.errors import EXIT_USAGE, PoprunError

if TYPE_CHECKING:
    from poprun.config.run_config import RunConfig
    from poprun.plan.topology import Topology
    from poprun.run.signals import SignalInbox
    from poprun.run.status.server import StatusServer


def run(
    values: dict[str, Any],
    program: tuple[str, ...],
    environ: dict[str, str] | None = None,
    *,
    inbox: SignalInbox | None = None,
) -> int:
    """Validate, plan and launch. Raises :class:`PoprunError` for bad input (nothing launched).

    ``inbox``: poprun's signal handlers, installed by :func:`main` (a caller of ``run``
    without it gets them for the run, and its own back afterwards).
    """
    from poprun.run.signals import SignalInbox

    if inbox is not None:
        return _run(values, program, environ, inbox)
    own = SignalInbox().install()
    try:
        return _run(values, program, environ, own)
    finally:
        own.restore()


def _run(
    values: dict[str, Any],
    program: tuple[str, ...],
    environ: dict[str, str] | None,
    inbox: SignalInbox,
) -> int:
    """:func:`run`, with poprun's signal handlers in place."""
    from poprun.config import config_file
    from poprun.config.options import option_name, parse_bool
    from poprun.plan.devices import check_pool, device_pool
    from poprun.plan.environment import mpirun_environment, with_allocator_defaults
    from poprun.plan.mpirun import find_mpirun, quote
    from poprun.plan.topology import on_hosts, render

    environ = dict(os.environ if environ is None else environ)
    log.set_verbosity(int(values.get("verbose") or 0))
    export_path = values.pop("export_config", None)
    overwrite = parse_bool("--overwrite-config", values.pop("overwrite_config", None) or "no")
    config = _configure(values, program, environ, export_path, overwrite)
    _announce(config)
    mpirun = find_mpirun(environ)
    environ = with_allocator_defaults(config, environ)

    topology, numactl = _plan(config, environ)
    pool = device_pool(environ)
    check_pool(topology, pool)
    local_only = config.allocation.local_only if config.allocation is not None else frozenset()
    argv_for = _argv_builder(mpirun, environ, numactl, pool, local_only, _setpriv(config, environ))
    argv = argv_for(config, topology)
    if config.vipu:
        names = ", ".join(option_name(k) for k, _ in config.vipu)
        log.warning(f"there is no V-IPU here: ignoring {names}")
    if export_path:
        config_file.export_file(config, export_path, overwrite=overwrite)
        log.info(f"wrote the configuration to {export_path}")
        if not config.program:
            return 0
    if config.print_topology:
        from poprun.plan.devices import gpus_here, idle_gpus_line

        idle = idle_gpus_line(topology, gpus_here(environ))
        sys.stdout.write(render(topology) + "\n" + (idle + "\n" if idle else ""))
        sys.stdout.flush()
    log.info(f"Running command: {quote(argv)}")
    if config.dry_run:
        sys.stdout.write(quote(argv) + "\n")
        return 0

    def replan(hosts: tuple[str, ...]) -> tuple[Topology, list[str]]:
        """The job on fewer hosts (``--min-hosts``): same replicas, instances per host."""
        smaller = on_hosts(config, hosts)
        planned = _plan(smaller, environ)[0]
        return planned, argv_for(smaller, planned)

    env = mpirun_environment(config, environ)
    return _launch(config, topology, argv, env, inbox, replan)


def _announce(config: RunConfig) -> None:
    """The engine's lines: which one was taken where several are present, how daemons
    start where it leaves a choice, and (``--dry-run``) where the hosts came from."""
    allocation = config.allocation
    lines = [config.engine_note] if config.engine_note else []
    if allocation is not None and allocation.announce:
        lines.append(allocation.announce)
    if allocation is not None and config.dry_run and config.hosts_from_allocation:
        lines.append(f"poprun: hosts from {allocation.describe()}")
    if lines:
        sys.stderr.write("".join(line + "\n" for line in lines))
        sys.stderr.flush()


def _setpriv(config: RunConfig, environ: Mapping[str, str]) -> str | None:
    """Across hosts: ``setpriv`` with ``--pdeathsig`` where this host has it (a job on this
    host alone asks for nothing: no process started on its launch path)."""
    from poprun.plan.hosts import is_local
    from poprun.plan.mpirun import find_setpriv

    if all(is_local(host) for host in config.hosts):
        return None
    return find_setpriv(environ)


def _argv_builder(
    mpirun: str,
    environ: Mapping[str, str],
    numactl: str | None,
    pool: Sequence[str] | None,
    local_only: frozenset[str] = frozenset(),
    setpriv: str | None = None,
) -> Callable[[RunConfig, Topology], list[str]]:
    """``build_argv`` given all it reads from this machine (a plan on fewer hosts reuses it)."""
    from poprun.plan.environment import forwarded_names
    from poprun.plan.fabric import local_devices
    from poprun.plan.mpirun import build_argv, mca_from_environment

    return functools.partial(
        build_argv,
        mpirun=mpirun,
        forwarded=forwarded_names(environ, local_only),
        is_root=os.geteuid() == 0,
        local_cpus=local_cores(),
        numactl=numactl,
        user_mca=mca_from_environment(environ),
        device_pool=pool,
        fabric_here=bool(local_devices()),
        setpriv=setpriv,
    )


def _launch(
    config: RunConfig,
    topology: Topology,
    argv: list[str],
    env: dict[str, str],
    inbox: SignalInbox,
    replan: Callable[[tuple[str, ...]], tuple[Topology, list[str]]],
) -> int:
    """The status endpoint (bound first: a port in use is a usage error, nothing launched),
    the ssh check (its connections kept for mpirun), then the supervised job.

    A job on this host alone starts its mpirun before the supervisor is imported, so that
    import runs while mpirun starts the instances (:mod:`poprun.run.launch`).
    """
    from poprun.plan.hosts import is_local
    from poprun.run.launch import Launch, descriptors_needed, raise_file_limit, with_secret

    raise_file_limit(descriptors_needed(config, topology))  # before anything opens or starts
    status = _status_server(config, topology)
    remote = [host for host in topology.hosts if not is_local(host)]
    shared = None
    launch = None
    try:
        if remote and config.ssh_check:
            from poprun.run import ssh_check

            engine_ssh = topology.allocation is None or topology.allocation.launcher.ssh
            shared = ssh_check.check(
                remote, config.global_args(), env, wait_s=config.ssh_wait, engine_ssh=engine_ssh
            )
        # The secret the instances' progress records carry.
        merged = with_secret({**env, **(shared.env() if shared else {})})
        if not remote:
            launch = Launch(topology, inbox)
            if not inbox.received:  # a signal now: the supervisor launches nothing
                launch.start(argv, merged)
        from poprun.run.supervisor import supervise

        return supervise(
            config,
            topology,
            argv,
            merged,
            inbox,
            status=status,
            replan=replan,
            shared=shared,
            launch=launch,
        )
    finally:
        if launch is not None:  # (the supervisor closed it, unless it failed before)
            launch.close()
        if shared is not None:
            shared.close()
        if status is not None:
            status.close()


def _status_server(config: RunConfig, topology: Topology) -> StatusServer | None:
    """``--status-port``: the endpoint, listening and serving; its address on stderr."""
    if config.status_port is None:
        return None
    from poprun.plan.mpirun import quote
    from poprun.run.status.server import StatusServer

    server = StatusServer(config.status_address or "127.0.0.1", config.status_port)
    per = config.num_replicas // config.num_instances
    server.live.job = {
        "command": quote(config.program),
        "topology": (
            f"{config.num_instances} instances x {per} replicas ({config.num_replicas} in all, "
            f"{config.ipus_per_replica} device(s) each) on {', '.join(topology.hosts)}"
        ),
        "timeout_s": config.timeout,
        "hang_timeout_s": config.hang_timeout,
        "on_hang": config.on_hang,
    }
    server.start()
    sys.stderr.write(
        f"poprun: status on {server.url}/metrics (Prometheus) and {server.url}/status\n"
        f"poprun: the job's live page: {server.url}/\n"
    )
    sys.stderr.flush()
    return server


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
    """The option values without typer (start-up speed); None when typer must handle it."""
    from poprun.config.options import BY_KEY

    values: dict[str, Any] = {}
    for option in options:
        name, _, value = option.partition("=")
        if name in ("--help", "--version", "--check-build"):
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


def _refuse_mpirun_spelling(token: str) -> None:
    word = token.partition("=")[0]
    if word in _MPIRUN_SPELLINGS:
        raise PoprunError(
            word, None, "is mpirun's option, not poprun's", f"use {_MPIRUN_SPELLINGS[word]}"
        )


def normalise(args: list[str]) -> tuple[list[str], list[str]]:
    """Split ``args`` into (options in ``--name=value`` form, program and its arguments)."""
    from poprun.config.options import BOOL_WORDS, OPTIONS, spelling_table

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
        _refuse_mpirun_spelling(token)
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
            import difflib

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
    """Entry point of the ``poprun`` console script (``argv`` None), or an in-process run.

    The signal handlers go in first; in-process, the caller's are put back on every path.
    """
    from poprun.run.signals import Interrupted, SignalInbox, hold_until_exit

    inbox = SignalInbox().install()
    try:
        code = _main(argv, inbox)
    except Interrupted as stop:  # a signal before the job was launched
        code = 128 + stop.signum
    finally:
        if argv is not None:
            inbox.restore()
        else:  # the command: one more Ctrl-C from here on cannot change how it ends
            hold_until_exit()
    if argv is None:
        _exit(code)
    return code


def _exit(code: int) -> NoReturn:
    """End the command now, its output flushed, without the interpreter's teardown.

    By here poprun has closed what it opened (the job's files, FIFOs, sockets, the status
    endpoint, the ssh masters) and registers no exit handlers; the teardown would only free
    memory and module by module: about 15 ms between the job's end and the shell prompt.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed: nothing left to deliver
            stream.flush()
    os._exit(code)


def _main(argv: list[str] | None, inbox: SignalInbox) -> int:
    """Read the command line and run it; a usage error is one line and exit code 2."""
    if argv is None:  # the real command: closed or vanishing standard streams are no error
        from poprun.run.output import console

        console.install()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options, program = normalise(args)
        values = _fast_values(options)
        if values is None:  # --help, --version, odd input: typer's command reads it
            parsed = _typer_values(options, program)
            if isinstance(parsed, int):
                return parsed
            values, program = parsed[0], list(parsed[1])
        return run(values, tuple(program), inbox=inbox)
    except PoprunError as error:
        sys.stderr.write(f"poprun: error: {error}\n")
        return EXIT_USAGE


def _typer_values(
    options: list[str], program: list[str]
) -> int | tuple[dict[str, Any], tuple[str, ...]]:
    """typer's reading of the options: (values, program), or the exit code it ends with."""
    import typer.main
    from typer import Exit, TyperException

    from poprun.config.command import typer_app

    command = typer.main.get_command(typer_app())
    try:
        result = command.main([*options, "--", *program], prog_name="poprun", standalone_mode=False)
    except Exit as done:
        return int(done.exit_code)
    except TyperException as error:  # click's usage errors (typer vendors click)
        sys.stderr.write(f"poprun: error: {error.format_message()}; fix: see poprun --help\n")
        return EXIT_USAGE
    if isinstance(result, tuple):
        return result
    return int(result or 0)
