"""poprun's error type and exit codes."""

from __future__ import annotations

#: Every instance succeeded.
EXIT_OK = 0
#: A usage or configuration error: nothing was launched.
EXIT_USAGE = 2
#: ``--timeout`` expired: the job was ended at the deadline (the GNU ``timeout`` convention).
EXIT_TIMEOUT = 124
#: mpirun itself could not be started or vanished without a status.
EXIT_LAUNCH_FAILED = 1


class PoprunError(ValueError):
    """A bad option value or configuration, reported before anything is launched.

    ``str(error)`` is one line: the option and its value, what is wrong, and the fix.
    """

    def __init__(self, option: str, value: object, problem: str, fix: str) -> None:
        self.option = option
        self.value = value
        self.problem = problem
        self.fix = fix
        shown = option if value is None else f"{option}={value}"
        super().__init__(f"{shown}: {problem}; fix: {fix}")


def read_user_file(option: str, path: str, kind: str) -> str:
    """The UTF-8 text of a file the user named with ``option``, or a :class:`PoprunError`.

    ``kind`` says what the file should be (``"a YAML file"``, ``"a host file"``).
    """
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as error:
        raise PoprunError(
            option, path, f"cannot read it ({error.strerror})", f"give a readable {kind}"
        ) from None
    except UnicodeDecodeError:
        raise PoprunError(option, path, "is not UTF-8 text", "save it as UTF-8 text") from None
