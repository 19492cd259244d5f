"""An instance's uncaught exception, reported to poprun as data (torchelastic's ``@record``).

When poprun asks for it (``POPDIST_ERROR_RECORD=1``, see :mod:`popdist.env`), ``import
popdist`` installs :func:`excepthook`. On an uncaught exception it writes one line to the
instance's own stderr, :data:`MARKER` followed by a JSON object (instance index, host, pid,
exception type, message, traceback text), and then calls the hook it replaced, so the usual
traceback still prints. The line travels back to poprun through mpirun's output forwarding
like any other stderr line, so it works across hosts with no shared filesystem; poprun
takes it out of the output and names the root cause from it, instead of from mpirun's
wording. Stdlib only, and nothing is imported until an exception happens.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import TracebackType
    from typing import Any

#: Starts the record line (``\x1f`` keeps it apart from anything a program prints).
MARKER = "\x1fpopdist-error="
#: The record's fields, in the order they are written.
FIELDS = ("instance", "host", "pid", "type", "message", "traceback")

_previous: Callable[..., Any] | None = None


def record(
    exc_type: type[BaseException],
    exc: BaseException,
    tb: TracebackType | None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The record of one exception: where it happened and what it was."""
    import traceback

    from popdist.env import reported_as

    instance, host = reported_as(os.environ if environ is None else environ)
    return {
        "instance": instance,
        "host": host,
        "pid": os.getpid(),
        "type": f"{exc_type.__module__}.{exc_type.__qualname__}".removeprefix("builtins."),
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc_type, exc, tb)),
    }


def record_line(fields: Mapping[str, Any]) -> str:
    """The one stderr line carrying ``fields`` (JSON never holds a raw newline)."""
    import json

    return MARKER + json.dumps(dict(fields), ensure_ascii=True) + "\n"


def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """Write the record line, then hand over to the previous hook (the normal traceback)."""
    if not issubclass(exc_type, KeyboardInterrupt):
        try:
            sys.stderr.write(record_line(record(exc_type, exc, tb)))
            sys.stderr.flush()
        except Exception:  # a broken record must never hide the traceback
            pass
    (_previous or sys.__excepthook__)(exc_type, exc, tb)


def install() -> None:
    """Make :func:`excepthook` the process's hook, chaining the current one (idempotent)."""
    global _previous
    if sys.excepthook is not excepthook:
        _previous = sys.excepthook
        sys.excepthook = excepthook


def install_if_asked(environ: Mapping[str, str] | None = None) -> bool:
    """Install the hook when the launcher asked for records; whether it did."""
    from popdist.env import ERROR_RECORD

    environ = os.environ if environ is None else environ
    if environ.get(ERROR_RECORD, "").strip() != "1":
        return False
    install()
    return True
