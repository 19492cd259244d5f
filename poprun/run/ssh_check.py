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

The check passes Open MPI's ``plm_rsh_args`` on (a Kubernetes MPIJob's ``-o
ConnectionAttempts=10``, a port), tries :data:`CONCURRENCY` hosts at a time (one line says
so for more), and tries again, every second for up to ``--ssh-wait`` (:data:`WAIT_S`), a host
that is not reachable *yet* (refused, timed out, its name not known yet: :data:`NOT_YET`):
an MPIJob's workers start beside its launcher. One line says what it waits for.

Skipped where the engine's job starts Open MPI's daemons itself (the allocation's
``Launcher``: ``srun`` in a Slurm job, ``qrsh -inherit`` in Grid Engine's, LSF's
``blaunch``), and when ``plm`` names a launcher other than ``rsh``. Under PBS the check
runs: Open MPI uses ssh there unless it was built with PBS's TM interface (Debian's is not).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from poprun.config.options import SSH_WAIT_S
from poprun.errors import PoprunError
from poprun.plan.engines.allocation import mca_value
from poprun.run import leftovers

#: ssh's own connection time-out, and how much longer one try may take.
CONNECT_TIMEOUT_S = 5
_SLACK_S = 3.0
#: How long a master connection outlives its last use: it must bridge the moment from the
#: check to mpirun's first ssh (if it does not, ssh just connects anew), and it is how long
#: one outlives a SIGKILLed poprun.
PERSIST_S = 3
#: How many hosts are tried at once (Open MPI's own ``plm_rsh_num_concurrent`` is 128).
CONCURRENCY = 64
#: ``--ssh-wait``'s default: how long a host that is not reachable yet is tried again.
WAIT_S = SSH_WAIT_S
#: Between two tries of a host that is not reachable yet.
RETRY_S = 1.0
#: ssh's words for a host that may answer later (sshd, the network or its name not up yet);
#: anything else (a refused key, a changed host key, no ssh) will not mend by waiting.
NOT_YET = (
    "Connection refused", "timed out", "No route to host", "Network is unreachable",
    "Could not resolve hostname", "Name or service not known", "Temporary failure in name",
    "Connection closed by", "Connection reset by", "kex_exchange_identification", "no answer",
)  # fmt: skip


def agent(global_args: Sequence[str], environ: Mapping[str, str]) -> list[str] | None:
    """Open MPI's launch agent as an argv prefix; None when it is not ssh-like.

    ``--mca plm_rsh_agent X`` in the mpirun args wins over ``OMPI_MCA_plm_rsh_agent``;
    the default is ``ssh``. Open MPI's ``A : B`` list means "A, else B": the first is taken.
    """
    value = mca_value(global_args, "plm_rsh_agent", environ.get("OMPI_MCA_plm_rsh_agent", "ssh"))
    words = shlex.split(value.split(":", 1)[0])
    if not words or "ssh" not in os.path.basename(words[0]):
        return None
    return words


def rsh_args(global_args: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """The arguments Open MPI adds to every agent call (``plm_rsh_args``: a Kubernetes
    MPIJob's ``-o ConnectionAttempts=10``, a port): the check passes them on too."""
    return shlex.split(
        mca_value(global_args, "plm_rsh_args", environ.get("OMPI_MCA_plm_rsh_args", ""))
    )


def launched_by_scheduler(
    environ: Mapping[str, str], global_args: Sequence[str], engine_ssh: bool = True
) -> bool:
    """Whether Open MPI will start its daemons some other way than ssh: the user's ``plm``
    says so, or else the engine's job does (``engine_ssh`` False: srun, ``qrsh -inherit``,
    ``blaunch``)."""
    plm = mca_value(global_args, "plm", environ.get("OMPI_MCA_plm", ""))
    if plm:
        return plm not in ("rsh", "ssh")
    return not engine_ssh


def _attempts(args: Sequence[str]) -> int:
    """ssh's ``ConnectionAttempts`` among ``-o`` options (1 when not given): ``-o
    ConnectionAttempts=N``, ``-oConnectionAttempts=N`` or ``-o "ConnectionAttempts N"``."""
    found = 1
    for word in args:
        word = word.removeprefix("-o").strip()
        key, _, value = word.replace("=", " ", 1).partition(" ")
        value = value.strip()
        if key.lower() == "connectionattempts" and value.isascii() and value.isdigit():
            found = max(1, int(value))
    return found


def unreachable(
    hosts: Sequence[str],
    command: Sequence[str],
    timeout: float = CONNECT_TIMEOUT_S,
    *,
    masters: bool = False,
    wait_s: float = 0.0,
    concurrency: int = CONCURRENCY,
    say: Callable[[str], None] | None = None,
) -> list[tuple[str, str]]:
    """``(host, why)`` for each host where ``COMMAND -o ... HOST true`` fails, in host order.

    With ``masters`` (``command`` opens persistent master connections) the try is
    ``COMMAND -o ... -N HOST``: ssh returns as soon as it has logged in, leaving the master
    behind, and no remote session is started for ``true`` (one session setup less before
    mpirun's own, issue 33). Without a master, ``-N`` would never return: ``true`` stays.

    ``concurrency`` hosts are tried at a time; a try still running after ``timeout`` (times
    ssh's own ``ConnectionAttempts``, a second apart) plus a little is killed (its own
    process group) and counted as failed. A host that is not reachable *yet* (:data:`NOT_YET`) is tried again
    every :data:`RETRY_S` for up to ``wait_s``, ``say`` told once what is waited for.
    """
    base = [*command, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout:g}"]
    # ssh waits a second between its attempts
    attempts = _attempts(command)
    limit = attempts * timeout + (attempts - 1) + _SLACK_S

    running = _Running()

    def tries(pending: Sequence[str]) -> dict[str, str]:
        argv = {h: [*base, "-N", h] if masters else [*base, h, "true"] for h in pending}

        def one(host: str) -> str:
            return _try(argv[host], limit, running)

        return run_all(list(pending), one, concurrency, on_abort=running.kill)

    return wait_for(hosts, tries, wait_s=wait_s, clock=time.monotonic, pause=time.sleep, say=say)


def wait_for(
    hosts: Sequence[str],
    tries: Callable[[Sequence[str]], Mapping[str, str]],
    *,
    wait_s: float,
    clock: Callable[[], float],
    pause: Callable[[float], None],
    say: Callable[[str], None] | None = None,
) -> list[tuple[str, str]]:
    """Try every host (``tries``: host -> why it failed, "" when it answered); try again
    those not reachable yet until ``wait_s`` has passed. Pure on ``clock`` and ``pause``."""
    deadline = clock() + wait_s
    failed: dict[str, str] = {}
    pending = list(hosts)
    while pending:
        answers = tries(pending)
        later = [h for h in pending if answers.get(h) and _not_yet(answers[h])]
        failed.update({h: answers[h] for h in pending if answers.get(h) and h not in later})
        if not later or clock() + RETRY_S > deadline:
            failed.update({h: answers[h] for h in later})
            break
        if say is not None:
            shown = "; ".join(f"{h}: {answers[h]}" for h in later[:3])
            more = f" and {len(later) - 3} more" if len(later) > 3 else ""
            say(
                f"poprun: waiting for {len(later)} host(s) to answer ssh ({shown}{more}); "
                f"trying again for up to {wait_s:g} s (--ssh-wait)"
            )
            say = None  # one line
        pause(RETRY_S)
        pending = later
    return [(host, failed[host]) for host in hosts if host in failed]


def _not_yet(why: str) -> bool:
    return any(words in why for words in NOT_YET)


def run_all(
    hosts: list[str],
    one: Callable[[str], str],
    concurrency: int = CONCURRENCY,
    *,
    on_abort: Callable[[], None] = lambda: None,
) -> dict[str, str]:
    """``one(host)`` for every host, ``concurrency`` at a time (a bounded pool of threads,
    each waiting on one ssh process), as ``{host: result}``. Interrupted (Ctrl-C), the
    tries not begun are dropped and ``on_abort`` ends those running, so that the pool's
    threads return at once rather than after their ssh's time-outs."""
    if len(hosts) <= 1:
        return {host: one(host) for host in hosts}
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=min(concurrency, len(hosts)))
    try:
        return dict(zip(hosts, pool.map(one, hosts), strict=True))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        on_abort()
        raise
    finally:
        pool.shutdown(wait=True)


class _Running:
    """The ssh tries running now, to end by their process groups when the check is
    interrupted (each try is its own session: the group is ours alone)."""

    def __init__(self) -> None:
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._killed = False

    def add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.add(proc)
            if self._killed:  # started as the check was being interrupted
                _kill_group(proc)

    def discard(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)

    def kill(self) -> None:
        with self._lock:
            self._killed = True
            for proc in self._procs:
                _kill_group(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _try(argv: Sequence[str], limit: float, running: _Running | None = None) -> str:
    """Run one ssh try: "" when it succeeded, else its last line of error (or why not)."""
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as error:
        return f"cannot run {argv[0]}: {error.strerror}"
    if running is not None:
        running.add(proc)
    try:
        return _finish(proc, limit)
    finally:
        if running is not None:
            running.discard(proc)


def _finish(proc: subprocess.Popen[bytes], limit: float) -> str:
    """Wait for one try, at most ``limit`` seconds (then end its group): its result."""
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_group(proc)  # its own group: ours alone
        proc.communicate()
        return f"no answer within {limit:g} s"
    if proc.returncode == 0:
        return ""
    lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit code {proc.returncode}"


@dataclass
class SharedConnections:
    """The check's ssh connections, kept open as masters for mpirun's daemons to reuse."""

    command: list[str]
    hosts: Sequence[str]
    directory: str
    #: ``plm_rsh_args``: mpirun adds them to every agent call itself; ``-O exit`` needs them
    #: too (a port is part of the master's ``ControlPath`` name).
    extra: Sequence[str] = ()

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
        """``ssh -O exit`` for each host's master, :data:`CONCURRENCY` at a time."""
        base = [*self.command, *self.extra, *self.option(), "-O", "exit"]
        argv = {host: [*base, host] for host in hosts}
        run_all(list(hosts), lambda host: _try(argv[host], CONNECT_TIMEOUT_S))


def check(
    hosts: Sequence[str],
    global_args: Sequence[str],
    environ: Mapping[str, str],
    *,
    wait_s: float = WAIT_S,
    engine_ssh: bool = True,
) -> SharedConnections | None:
    """Raise a :class:`PoprunError` naming the first remote host ssh cannot reach, after
    ``wait_s`` (``--ssh-wait``) for hosts that are not reachable yet.

    ``engine_ssh``: whether the engine's job leaves the daemons' start to ssh (not inside
    Slurm, Grid Engine's ``qrsh -inherit`` or LSF's ``blaunch``: then there is no check).
    The connections stay open for mpirun where its agent can be given through the
    environment: the caller passes :meth:`SharedConnections.env` to mpirun and closes them.
    """
    if not hosts or launched_by_scheduler(environ, global_args, engine_ssh):
        return None
    command = agent(global_args, environ)
    if command is None:
        return None
    command = [*command, *rsh_args(global_args, environ)]
    shown = " ".join(shlex.quote(a) for a in [*command, "-o", "BatchMode=yes"])
    shared = None
    # An agent given by --mca in the mpirun args outranks the environment mpirun gets.
    by_mca = mca_value(global_args, "plm_rsh_agent", "")
    if not by_mca and not any("ControlPath" in word for word in command):
        words = agent(global_args, environ) or []
        shared = SharedConnections(
            words, hosts, leftovers.private_dir("poprun-ssh-"), command[len(words) :]
        )
        masters = [*shared.option(), "-o", "ControlMaster=auto"]
        command = [*command, *masters, "-o", f"ControlPersist={PERSIST_S}"]
    if len(hosts) > CONCURRENCY:
        _say(f"poprun: checking ssh to {len(hosts)} hosts, {CONCURRENCY} at a time")
    try:
        bad = unreachable(hosts, command, masters=shared is not None, wait_s=wait_s, say=_say)
    except BaseException:  # Ctrl-C (Interrupted) during the check: no master left behind
        if shared is not None:
            shared.close()
        raise
    if not bad:
        return shared
    if shared is not None:
        shared.close()
    host, why = bad[0]
    others = f" (also unreachable: {', '.join(h for h, _ in bad[1:4])}" if bad[1:] else ""
    if len(bad) > 4:
        others += f" and {len(bad) - 4} more"
    others += ")" if bad[1:] else ""
    waited = f" (tried for {wait_s:g} s, --ssh-wait)" if wait_s and _not_yet(why) else ""
    tried = f"{shown} -N {shlex.quote(host)}" if shared else f"{shown} {shlex.quote(host)} true"
    raise PoprunError(
        "--host",
        host,
        f"cannot be reached by ssh: `{tried}` failed: {why}{waited}{others}",
        "check the host name, that sshd runs there and that key login works without a "
        "password; or pass --ssh-check=no to let mpirun try anyway",
    )


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
