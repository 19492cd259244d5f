"""typer's ``poprun`` command, built from the option table: ``--help``, ``--version``, odd input.

typer (and the pydantic it imports, ~50 ms) is loaded only when this is needed: the usual
command line is read by :func:`poprun.cli.normalise` alone. The command's callback returns
the values typer parsed; :func:`poprun.cli.main` runs them.
"""

from __future__ import annotations

import inspect
import sys
from typing import Annotated, Any

import typer

from poprun import __version__
from poprun.config.options import FLAGS, OPTIONS

HELP = (
    "Launch PROGRAM as --num-instances instances with mpirun, splitting --num-replicas "
    "replicas evenly over them (PopRun-compatible). Exit code: 0 when every instance "
    "succeeds; the first failing instance's code (128+N for signal N); 124 at --timeout; "
    "2 for a usage error (nothing launched)."
)


def _command(**values: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Collect the options typer parsed: (values, program) for :func:`poprun.cli.run`."""
    program = values.pop("program")
    if values.pop("version"):
        sys.stdout.write(f"poprun {__version__} (PopRun-compatible launcher on Open MPI)\n")
        raise typer.Exit(0)
    if values.pop("check_build"):
        from poprun import check_build

        raise typer.Exit(check_build.check())
    if values.pop("vv"):
        values["verbose"] = max(values["verbose"], 2)
    return values, tuple(program or ())


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
    (verbose, verbose_help), (vv, vv_help), (version, version_help), _, (check, check_help) = FLAGS
    params.append(param("verbose", int, typer.Option(*verbose, count=True, help=verbose_help), 0))
    params.append(param("vv", bool, typer.Option(*vv, help=vv_help), False))
    params.append(param("version", bool, typer.Option(*version, help=version_help), False))
    params.append(param("check_build", bool, typer.Option(*check, help=check_help), False))
    return params


def typer_app() -> typer.Typer:
    """The typer application (built only for ``--help``, ``--version`` and odd input)."""
    params = _parameters()
    _command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    _command.__annotations__ = {p.name: p.annotation for p in params} | {"return": Any}
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
