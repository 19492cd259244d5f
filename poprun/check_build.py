"""``poprun --check-build``: what this installation can run, printed without starting a job.

In the spirit of ``horovodrun --check-build`` and ``python -m torch.utils.collect_env``: the
versions of poprun, torch, Open MPI (the ``mpirun`` on PATH) and mpi4py with the MPI library
it was built against; the collectives backends (Horovod with its controllers and tensor
operations, torch.distributed's gloo, MPI and NCCL) and the one ``--backend auto`` would take;
the GPUs torch sees; the cluster engine's job around poprun (Slurm, Grid Engine, LSF, PBS,
a Kubernetes launcher's host file: :mod:`poprun.plan.engines`), the ssh client and the fabric devices
(:mod:`poprun.plan.fabric`); and the packages each optional feature still needs. poprun
never imports torch: the interpreter's side is :mod:`popdist.installation`, run in a child of
this interpreter (``sys.executable``, the one ``poprun`` was installed into). Exit 0 when a job can run here, else 1 with the reasons.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from poprun import __version__

__all__ = ["check", "host_facts", "render"]

#: The child interpreter's probe takes a second or two (it imports torch); never wait forever.
PROBE_TIMEOUT_S = 120.0


def _first_line(argv: list[str], *, stderr: bool = False) -> str | None:
    """The first line a tool prints about itself (``None``: it did not run)."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=10, start_new_session=True
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stderr if stderr else done.stdout) or done.stdout or done.stderr
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else None


def host_facts(environ: Mapping[str, str]) -> dict[str, Any]:
    """What poprun sees itself: mpirun, the cluster job around it, the ssh client, the fabric."""
    from poprun.plan.fabric import local_devices

    path = environ.get("PATH", os.defpath)
    mpirun = shutil.which("mpirun", path=path)
    ssh = shutil.which("ssh", path=path)
    return {
        "mpirun": mpirun,
        "mpirun_version": _first_line([mpirun, "--version"]) if mpirun else None,
        "cluster": _cluster(environ),
        "ssh": ssh,
        "ssh_version": _first_line([ssh, "-V"], stderr=True) if ssh else None,
        "fabric": local_devices(),
    }


def _cluster(environ: Mapping[str, str]) -> str | None:
    """The cluster engine's job around poprun, as ``--print-topology`` shows it (None: none;
    a garbled one: its error)."""
    from poprun.config.run_config import engine_of
    from poprun.errors import PoprunError

    try:
        allocation, note = engine_of({}, environ)
    except PoprunError as error:
        return f"unreadable: {error}"
    if allocation is None:
        return None
    return allocation.render() + (f" ({note.removeprefix('poprun: ')})" if note else "")


def _probe(executable: str) -> dict[str, Any]:
    """:mod:`popdist.installation`'s report from a child ``executable`` (or an ``error``)."""
    argv = [executable, "-m", "popdist.installation"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, start_new_session=True
        )
    except subprocess.TimeoutExpired:
        return {"error": f"{' '.join(argv)} did not answer within {PROBE_TIMEOUT_S:.0f} s"}
    except OSError as exc:
        return {"error": f"{' '.join(argv)} did not start ({exc.strerror or exc})"}
    lines = done.stdout.strip().splitlines()
    try:
        answer: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"{' '.join(argv)} failed (exit {done.returncode}): {tail}"}
    return answer


def _box(flag: object) -> str:
    return "[X]" if flag else "[ ]"


def _boxes(flags: Mapping[str, object]) -> str:
    return " ".join(f"{_box(on)} {name}" for name, on in flags.items())


def _versions(probe: Mapping[str, Any], host: Mapping[str, Any], problems: list[str]) -> list[str]:
    """poprun, Python, torch, Open MPI, mpi4py and the MPI library mpi4py was built against."""
    lines = [
        f"poprun {__version__} (popdist-open {probe.get('popdist') or 'not installed'})",
        f"Python {probe['python']} ({probe['executable']})",
    ]
    torch = probe.get("torch", {})
    if "version" in torch:
        cuda = f"CUDA {torch['cuda']}" if torch.get("cuda") else "CPU build"
        lines.append(f"torch {torch['version']} ({cuda})")
    else:
        lines.append(f"torch: {torch.get('error', 'missing')}")
        problems.append("torch does not import")
    if host["mpirun"]:
        lines.append(f"Open MPI: {host['mpirun_version'] or 'version unknown'} ({host['mpirun']})")
    else:
        lines.append("Open MPI: no mpirun on PATH")
        problems.append("mpirun is not on PATH (install Open MPI: apt-get install openmpi-bin)")
    mpi4py = probe.get("mpi4py", {})
    if "version" in mpi4py:
        lines.append(f"mpi4py {mpi4py['version']}, built against: {mpi4py['library']}")
    else:
        lines.append(f"mpi4py: {mpi4py.get('error', 'missing')}")
    return lines


def _backends(probe: Mapping[str, Any], problems: list[str]) -> list[str]:
    """Horovod (controllers, tensor operations), torch.distributed, and what auto takes."""
    lines = ["Collectives backends:"]
    horovod = probe.get("horovod", {})
    if "version" in horovod:
        lines.append(f"    [X] horovod {horovod['version']}")
        lines.append(f"        controllers:       {_boxes(horovod['controllers'])}")
        lines.append(f"        tensor operations: {_boxes(horovod['operations'])}")
    else:
        lines.append(f"    [ ] horovod: {horovod.get('error', 'unknown')}")
    torch = probe.get("torch", {})
    if torch.get("distributed"):
        names = {"gloo": torch["gloo"], "MPI": torch["mpi"], "NCCL": torch["nccl"]}
        lines.append(f"    [X] torch.distributed: {_boxes(names)}")
    else:
        lines.append("    [ ] torch.distributed: not in this torch")
    auto = probe.get("auto", {})
    if auto.get("choice"):
        lines.append(f"    --backend auto takes: {auto['choice']} ({auto['reason']})")
    else:
        reason = auto.get("reason") or auto.get("error") or "the probe failed"
        lines.append(f"    --backend auto: no backend ({reason})")
        problems.append("no collectives backend can start")
    return lines


def _surroundings(probe: Mapping[str, Any], host: Mapping[str, Any]) -> list[str]:
    """The GPUs, the cluster job, the ssh client, the fabric, and what each optional feature
    lacks."""
    gpus = probe.get("torch", {}).get("gpus") or []
    where = host.get("cluster") or (
        "none around poprun (no Slurm, Grid Engine, LSF or PBS job, no Kubernetes or Open MPI "
        "default host file)"
    )
    lines = [f"GPUs torch sees: {', '.join(gpus) if gpus else 'none'}", f"Cluster: {where}"]
    lines.append(
        f"ssh client: {host['ssh_version'] or 'unknown version'} ({host['ssh']})"
        if host["ssh"]
        else "ssh client: none on PATH (needed only for hosts other than this one)"
    )
    fabric = host.get("fabric") or []
    lines.append(
        f"fabric: {', '.join(fabric)} (Open MPI picks it for jobs across hosts)"
        if fabric
        else "fabric: none (jobs across hosts, this one among them, take Open MPI's TCP path)"
    )
    missing = probe.get("missing", {})
    if missing:
        lines += ["", "Optional features:"]
        for feature, names in missing.items():
            state = f"missing {', '.join(names)}" if names else "ready"
            lines.append(f"    {feature}: {state}")
    return lines


def render(probe: Mapping[str, Any], host: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The report's lines, and why no job can run here (empty: one can)."""
    problems: list[str] = []
    if "error" in probe:
        problems.append(f"the interpreter's probe failed ({probe['error']})")
        return [f"Python interpreter: {probe['error']}"], problems
    lines = _versions(probe, host, problems)
    lines += ["", *_backends(probe, problems), "", *_surroundings(probe, host)]
    return lines, problems


def check(environ: Mapping[str, str] | None = None, executable: str | None = None) -> int:
    """Print the report; 0 when a job can run here, 1 (with the reasons) when not."""
    environ = os.environ if environ is None else environ
    host = host_facts(environ)
    lines, problems = render(_probe(executable or sys.executable), host)
    if problems:
        lines += ["", f"poprun: no job can run here: {'; '.join(problems)}"]
    else:
        lines += ["", "poprun: a job can run here"]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    return 1 if problems else 0
