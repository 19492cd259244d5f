"""Checks on the mpirun arguments a user passes through (``--mpi-global-args``, ...).

poprun builds the job's shape itself (instances, hosts, one app context per instance, the
``POPDIST_*`` variables), so mpirun options that set those would silently run something
else: they are refused, naming the poprun option to use. A bare word where an option was
expected (``--mpi-local-args echo``) would become the program mpirun runs (exit 0, nothing
of the user's ran): refused too.
"""

from __future__ import annotations

from collections.abc import Sequence

from poprun.errors import PoprunError

#: mpirun options poprun sets itself -> what to use instead.
_CONFLICTS: dict[str, str] = {
    **dict.fromkeys(("-np", "-n", "--np", "-c"), "--num-instances"),
    **dict.fromkeys(
        (
            "-H",
            "-host",
            "--host",
            "--hostfile",
            "-hostfile",
            "--machinefile",
            "-machinefile",
            "--default-hostfile",
            "-default-hostfile",
        ),
        "--host or --host-file",
    ),
    **dict.fromkeys(("--app", "-app"), "poprun's options (poprun writes the app contexts)"),
    **dict.fromkeys(("-npernode", "--npernode", "-N"), "--num-instances with --host"),
}
#: mpirun options that take no value (a bare word after one of these is a stray word).
_FLAGS = frozenset(
    ("--oversubscribe", "--tag-output", "-tag-output", "--timestamp-output", "--report-bindings",
     "--display-map", "--display-allocation", "-v", "--verbose", "-q", "--quiet",
     "--allow-run-as-root", "--merge-stderr-to-stdout", "--debug-daemons", "-d",
     "--leave-session-attached", "--hetero-nodes", "--xml", "--enable-recovery",
     "--noprefix", "--nolocal", "--nooversubscribe", "--use-hwthread-cpus", "--do-not-launch",
     "--continuous", "--show-progress", "--display-devel-map", "--report-child-jobs-separately")
)  # fmt: skip
#: Options that take two values.
_TWO_VALUES = frozenset(("--mca", "-mca", "--gmca", "-gmca"))


def check_mpi_args(option: str, words: Sequence[str]) -> None:
    """Refuse mpirun options poprun owns, ``-x POPDIST_*``, and stray bare words."""
    text = " ".join(words)
    expect_values = 0  # how many of the next words are an option's values
    for index, word in enumerate(words):
        if expect_values:
            expect_values -= 1
            if words[index - 1] == "-x" and word.startswith("POPDIST_"):
                raise PoprunError(
                    option,
                    text,
                    f"-x {word} would override a variable poprun sets for each instance",
                    "leave POPDIST_* to poprun: set the run's shape with poprun's options",
                )
            continue
        name = word.split("=", 1)[0]
        if name in _CONFLICTS:
            raise PoprunError(
                option,
                text,
                f"{name} conflicts with poprun's own handling of the job's shape",
                f"use poprun's {_CONFLICTS[name]} instead",
            )
        if not word.startswith("-"):
            raise PoprunError(
                option,
                text,
                f"{word!r} is not an mpirun option (mpirun would run it as the program)",
                "pass mpirun options only (e.g. --mca btl_tcp_if_include eth0); the program "
                "goes after poprun's options",
            )
        if "=" in word or name in _FLAGS:
            continue
        expect_values = 2 if name in _TWO_VALUES else 1
