"""poprun's error type and exit codes."""

from __future__ import annotations

#: Every instance succeeded.
EXIT_OK = 0
#: A usage or configuration error: nothing was launched.
EXIT_USAGE = 2
#: ``--timeout`` expired: the job was ended at the deadline (the GNU ``timeout`` convention).
EXIT_TIMEOUT = 124
#: The job stopped at its time limit after poprun's save-now notice (a Slurm job's end, or
#: ``--timeout`` with ``--time-limit-margin``): run it again to resume from its checkpoint
#: (sysexits.h's EX_TEMPFAIL, "try again later"; ``--requeue-on-timeout`` does it).
EXIT_TIME_LIMIT = 75
#: Hosts were lost and fewer than ``--min-hosts`` remain (without ``--min-hosts``: any host
#: lost while the job ran); the checkpoint is left as it was (sysexits.h's EX_UNAVAILABLE).
EXIT_HOSTS_LOST = 69
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
        text = str(value)
        if len(text) > 120:  # one readable line, whatever the user pasted
            text = f"{text[:100]}… ({len(text)} characters)"
        shown = option if value is None else f"{option}={text}"
        super().__init__(f"{shown}: {problem}; fix: {fix}")
