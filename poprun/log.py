"""poprun's own log lines: ``HH:MM:SS.mmm <pid> POPRUN [I] message`` on stderr.

Warnings always print; ``-v`` adds information lines (the full mpirun command among
them), ``-vv`` adds debug lines.
"""

from __future__ import annotations

import os
import sys
import time

_level = 0


def set_verbosity(level: int) -> None:
    """0: warnings only; 1: ``-v``; 2 or more: ``-vv``."""
    global _level
    _level = level


def _emit(tag: str, message: str) -> None:
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    sys.stderr.write(f"{stamp} {os.getpid()} POPRUN [{tag}] {message}\n")
    sys.stderr.flush()


def warning(message: str) -> None:
    """Always shown."""
    _emit("W", message)


def info(message: str) -> None:
    """Shown with ``-v``."""
    if _level >= 1:
        _emit("I", message)


def debug(message: str) -> None:
    """Shown with ``-vv``."""
    if _level >= 2:
        _emit("D", message)
