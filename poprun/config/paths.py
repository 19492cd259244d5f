"""Checks, before anything is launched, that poprun can write where the user asked.

``--output-dir`` and ``--export-config`` name places poprun writes to once the job is under
way (or right before): a path it cannot write must be a usage error (exit 2, one line, nothing
launched), not a traceback after the launch. Nothing is created here.
"""

from __future__ import annotations

import os

from poprun.errors import PoprunError

#: Kernel file systems: nothing a job writes belongs there.
_VIRTUAL = ("/proc", "/sys", "/dev")


def _virtual(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == top or real.startswith(top + "/") for top in _VIRTUAL)


def _existing_ancestor(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.lexists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def check_output_dir(option: str, path: str, num_instances: int) -> None:
    """``path`` can be (created and) written, and so can each instance's two files in it."""
    if _virtual(path):
        raise PoprunError(option, path, "is in a kernel file system", "give a directory on disk")
    ancestor = _existing_ancestor(path)
    if not os.path.isdir(ancestor):
        raise PoprunError(
            option,
            path,
            f"{ancestor} is a file, so the directory cannot be created",
            "give a directory path",
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        what = "is" if ancestor == os.path.abspath(path) else f"is under {ancestor}, which is"
        raise PoprunError(option, path, f"{what} not writable", "give a writable directory")
    if ancestor != os.path.abspath(path):
        return  # created at the start of the run: its files are new
    for index in range(num_instances):
        for kind in ("stdout", "stderr"):
            name = os.path.join(path, f"instance-{index}.{kind}")
            if os.path.isdir(name):
                raise PoprunError(
                    option, path, f"{name} is a directory", "remove it, or give another directory"
                )
            if os.path.lexists(name) and not os.access(name, os.W_OK):
                raise PoprunError(
                    option, path, f"{name} is not writable", "remove it, or give another directory"
                )


def check_file_target(option: str, path: str) -> None:
    """A file ``path`` can be created (its directory exists, is writable, is on disk)."""
    parent = os.path.dirname(os.path.abspath(path))
    if _virtual(parent):
        raise PoprunError(option, path, "is in a kernel file system", "give a file path on disk")
    if os.path.isdir(parent) and not os.access(parent, os.W_OK | os.X_OK):
        raise PoprunError(
            option, path, f"directory {parent} is not writable", "give a writable location"
        )
