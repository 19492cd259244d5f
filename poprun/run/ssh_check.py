"""Before a multi-host launch: can every remote host be reached by ssh?

Open MPI starts one daemon per remote host through its launch agent (``ssh`` unless
``plm_rsh_agent`` says otherwise). When one host cannot be reached, mpirun says only "ORTE
was unable to reliably start one or more daemons", without the host. poprun first runs
``AGENT -o BatchMode=yes -o ConnectTimeout=T HOST true`` for every remote host at once (the
same agent Open MPI will use, so the same keys and ssh configuration) and names the first
host that fails, before anything is launched. ``--ssh-check=no`` skips it.

The check's connections are not thrown away: each becomes an ssh master (``ControlMaster``,
socket in a private directory) and mpirun's agent becomes ``AGENT -o ControlPath=...`` in
its environment (:meth:`SharedConnections.env`), so Open MPI's daemons start over the
connection the check opened instead of a second handshake. Such a check logs in only
(``ssh -N``: it returns once authenticated, the master stays) and runs nothing remotely:
before issue 33 it ran ``true`` in a remote session too, a session setup mpirun's daemon
start then repeated (the check cost 1.08-1.11x bare mpirun's 2-host launch against
1.01-1.04x without it).
Not done when ``--mca plm_rsh_agent`` in the mpirun args chose the agent (it outranks the
environment) or the agent sets a ``ControlPath`` itself. poprun closes the masters when the
job ends (``ssh -O exit``); one left by a killed poprun exits after :data:`PERSIST_S` idle
seconds.

Skipped by itself inside a Slurm allocation, where Open MPI starts its daemons through
``srun``, not ssh (and when ``plm`` names a launcher other than ``rsh``). Under PBS the check
runs: Open MPI uses ssh there unless it was built with PBS's TM interface (Debian's is not).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from poprun.errors import PoprunError
from poprun.run import leftovers

#: ssh's own connection time-out, and how much longer the whole check may take.
CONNECT_TIMEOUT_S = 5
_SLACK_S = 3.0
#: How long a master connection outlives its last use: it must bridge the moment from the
#: check to mpirun's first ssh (if it does not, ssh just connects anew), and it is how long
#: one outlives a SIGKILLed poprun.
PERSIST_S = 3
#: Variables that mean Open MPI launches through Slurm's srun, not ssh.
SCHEDULER_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID")


def _mca(args: Sequence[str], name: str, default: str) -> str:
    """The last ``--mca NAME VALUE`` in ``args``, else ``default``."""
    value = default
    for i, arg in enumerate(args[:-2]):
        if arg in ("--mca", "-mca", "--gmca", "-gmca") and args[i + 1] == name:
            value = args[i + 2]
    return value


def agent(global_args: Sequence[str], environ: Mapping[str, str]) -> list[str] | None:
    """Open MPI's launch agent as an argv prefix; None when it is not ssh-like.

    ``--mca plm_rsh_agent X`` in the mpirun args wins over ``OMPI_MCA_plm_rsh_agent``;
    the default is ``ssh``. Open MPI's ``A : B`` list means "A, else B": the first is taken.
    """
    value = _mca(global_args, "plm_rsh_agent", environ.get("OMPI_MCA_plm_rsh_agent", "ssh"))
    words = shlex.split(value.split(":", 1)[0])
    if not words or "ssh" not in os.path.basename(words[0]):
        return None
    return words


def launched_by_scheduler(environ: Mapping[str, str], global_args: Sequence[str]) -> bool:
    """Whether Open MPI will start its daemons some other way than ssh (Slurm, or its ``plm``)."""
    plm = _mca(global_args, "plm", environ.get("OMPI_MCA_plm", ""))
    if plm:
        return plm not in ("rsh", "ssh")
    return any(name in environ for name in SCHEDULER_VARIABLES)


def unreachable(
    hosts: Sequence[str],
    command: Sequence[str],
    timeout: float = CONNECT_TIMEOUT_S,
    *,
    masters: bool = False,
) -> list[tuple[str, str]]:
    """``(host, why)`` for each host where ``COMMAND -o ... HOST true`` fails, in host order.

    With ``masters`` (``command`` opens persistent master connections) the try is
    ``COMMAND -o ... -N HOST``: ssh returns as soon as it has logged in, leaving the master
    behind, and no remote session is started for ``true`` (one session setup less before
    mpirun's own, issue 33). Without a master, ``-N`` would never return: ``true`` stays.

    All hosts are tried at once; a try still running after ``timeout`` plus a little is
    killed (its own process group) and counted as failed.
    """
    base = [*command, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout:g}"]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    failed: dict[str, str] = {}
    for host in hosts:
        try:
            procs[host] = subprocess.Popen(
                [*base, "-N", host] if masters else [*base, host, "true"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as error:
            failed[host] = f"cannot run {command[0]}: {error.strerror}"
    deadline = time.monotonic() + timeout + _SLACK_S
    for host, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own group: ours alone
            proc.communicate()
            failed[host] = f"no answer within {timeout + _SLACK_S:g} s"
            continue
        if proc.returncode != 0:
            lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
            failed[host] = lines[-1].strip() if lines else f"exit code {proc.returncode}"
    return [(host, failed[host]) for host in hosts if host in failed]


@dataclass
class SharedConnections:
    """The check's ssh connections, kept open as masters for mpirun's daemons to reuse."""

    command: list[str]
    hosts: Sequence[str]
    directory: str

    def option(self) -> list[str]:
        return ["-o", f"ControlPath={self.directory}/%C"]

    def env(self) -> dict[str, str]:
        """mpirun's environment: its launch agent goes through the masters."""
        return {"OMPI_MCA_plm_rsh_agent": shlex.join([*self.command, *self.option()])}

    def drop(self, hosts: Sequence[str]) -> None:
        """Stop the masters of lost ``hosts`` now. A master holds the output pipes of every
        session through it (ssh passes them over its socket), and a session with a host that
        no longer answers never ends: mpirun's output would not end with mpirun."""
        self._stop(hosts)

    def close(self) -> None:
        """Stop every master (``ssh -O exit``, all hosts at once) and remove their directory."""
        self._stop(self.hosts)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _stop(self, hosts: Sequence[str]) -> None:
        stopping = []
        for host in hosts:
            with contextlib.suppress(OSError):
                stopping.append(
                    subprocess.Popen(
                        [*self.command, *self.option(), "-O", "exit", host],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        for proc in stopping:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own group: ours alone
                proc.wait()


def check(
    hosts: Sequence[str], global_args: Sequence[str], environ: Mapping[str, str]
) -> SharedConnections | None:
    """Raise a :class:`PoprunError` naming the first remote host ssh cannot reach.

    The connections stay open for mpirun where its agent can be given through the
    environment: the caller passes :meth:`SharedConnections.env` to mpirun and closes them.
    """
    if not hosts or launched_by_scheduler(environ, global_args):
        return None
    command = agent(global_args, environ)
    if command is None:
        return None
    shown = " ".join(shlex.quote(a) for a in [*command, "-o", "BatchMode=yes"])
    shared = None
    # An agent given by --mca in the mpirun args outranks the environment mpirun gets.
    by_mca = _mca(global_args, "plm_rsh_agent", "")
    if not by_mca and not any("ControlPath" in word for word in command):
        shared = SharedConnections(command, hosts, leftovers.private_dir("poprun-ssh-"))
        masters = [*shared.option(), "-o", "ControlMaster=auto"]
        command = [*command, *masters, "-o", f"ControlPersist={PERSIST_S}"]
    bad = unreachable(hosts, command, masters=shared is not None)
    if not bad:
        return shared
    if shared is not None:
        shared.close()
    host, why = bad[0]
    others = f" (also unreachable: {', '.join(h for h, _ in bad[1:])})" if bad[1:] else ""
    tried = f"{shown} -N {shlex.quote(host)}" if shared else f"{shown} {shlex.quote(host)} true"
    raise PoprunError(
        "--host",
        host,
        f"cannot be reached by ssh: `{tried}` failed: {why}{others}",
        "check the host name, that sshd runs there and that key login works without a "
        "password; or pass --ssh-check=no to let mpirun try anyway",
    )
