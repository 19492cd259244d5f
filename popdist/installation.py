"""What this interpreter can run: versions, collectives backends, GPUs, missing packages.

``python -m popdist.installation`` prints it as one JSON object; ``poprun --check-build``
runs it in a child interpreter (poprun itself never imports torch) and adds what poprun
sees itself (mpirun, Slurm, ssh). Each probe is independent and catches its own failure,
so one broken library is reported, not fatal. MPI is not initialised: mpi4py is asked for
the library it was built against only.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import sys
from typing import Any

__all__ = ["missing_by_feature", "report"]

#: An optional feature that is not an extra of the distribution: what it needs.
HOROVOD_FEATURE = ("horovod (the horovod backend)", ("horovod",))
DISTRIBUTION = "popdist-open"


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    return match.group(0) if match else requirement


def missing_by_feature(
    requires: list[str] | None = None, installed: Any = _version
) -> dict[str, list[str]]:
    """For each optional feature (the distribution's extras, and the Horovod backend), the
    distributions it needs that are not installed (``requires``: the distribution's
    ``Requires-Dist`` lines; ``installed``: a name → version or ``None`` lookup)."""
    if requires is None:
        try:
            requires = importlib.metadata.requires(DISTRIBUTION) or []
        except importlib.metadata.PackageNotFoundError:
            requires = []
    features: dict[str, list[str]] = {}
    for line in requires:
        requirement, _, marker = line.partition(";")
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if extra is None or extra.group(1) == "dev":
            continue
        name = _requirement_name(requirement.strip())
        needed = features.setdefault(f"{extra.group(1)} (pip extra [{extra.group(1)}])", [])
        if installed(name) is None:
            needed.append(name)
    feature, names = HOROVOD_FEATURE
    features[feature] = [name for name in names if installed(name) is None]
    return features


def _torch() -> dict[str, Any]:
    from popdist.collectives.torchdist import build_info

    return build_info()


def _mpi4py() -> dict[str, Any]:
    import mpi4py

    mpi4py.rc.initialize = False  # the library's version only: no MPI_Init here
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    first = MPI.Get_library_version().strip().splitlines()[0]
    library = ", ".join(part.strip() for part in first.split(",")[:2])  # name, version, package
    return {"version": mpi4py.__version__, "library": library}


def _horovod() -> dict[str, Any]:
    from popdist.collectives.horovod import build_info

    return build_info()


def _probe(function: Any) -> dict[str, Any]:
    try:
        result: dict[str, Any] = function()
    except Exception as exc:  # a missing or broken library is an answer, not a crash
        return {"error": f"{type(exc).__name__}: {exc}"}
    return result


def _auto() -> dict[str, Any]:
    from popdist.collectives import auto

    probes = auto.probe()
    try:
        choice = auto.decide([probes])
    except Exception as exc:
        return {"choice": None, "reason": str(exc), "probes": probes}
    return {"choice": choice.name, "reason": choice.reason, "probes": probes}


def report() -> dict[str, Any]:
    """This interpreter's installation, JSON-ready."""
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "popdist": _version(DISTRIBUTION),
        "torch": _probe(_torch),
        "mpi4py": _probe(_mpi4py),
        "horovod": _probe(_horovod),
        "auto": _probe(_auto),
        "missing": missing_by_feature(),
    }


if __name__ == "__main__":
    json.dump(report(), sys.stdout)
    sys.stdout.write("\n")
