"""The instance's side of poprun's lease: an instance cut off from poprun ends itself.

In a job across hosts, poprun exports ``POPDIST_LEASE`` (``ADDRESS:PORT``, :mod:`popdist.env`).
``import popdist`` then starts a daemon thread that connects there, says who it is (the job's
secret from ``POPDIST_PROGRESS``, the generation, the instance index), sends a heartbeat
about once a second and reads poprun's renewals. With no renewal for :data:`LEASE_S`
seconds (a network cut, poprun gone or frozen), or when poprun closes the connection (it
ended this attempt, or this instance belongs to an older one), the instance writes one line
to its stderr and ends itself and its process group with SIGKILL: a host cut off from the
job never goes on as a second job, nor writes a checkpoint after the cut.

The thread needs only the GIL, which an instance waiting in a collective or in ``sleep``
has released; a C call that holds it for a while holds the thread too, and the thread then
reads the renewals that queued up meanwhile (only their absence ends the instance).
Stdlib only; without ``POPDIST_LEASE`` nothing starts.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from popdist.env import GENERATION, LEASE, PROGRESS, PopdistError, generation, reported_as

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping

#: No renewal from poprun for this long: the instance ends itself (fencing within 15 s).
LEASE_S = 10.0
#: How often the instance sends its heartbeat and looks at its lease.
BEAT_S = 1.0
#: What a renewal from poprun reads as; the heartbeat the instance sends.
HEARTBEAT = b"a\n"

_holder: threading.Thread | None = None


def start_if_asked(environ: Mapping[str, str] | None = None) -> bool:
    """Hold the lease when poprun gives one (``POPDIST_LEASE``); idempotent."""
    global _holder
    environ = os.environ if environ is None else environ
    where = environ.get(LEASE, "").strip()
    secret = environ.get(PROGRESS, "").strip()
    if not where or not secret or _holder is not None:
        return _holder is not None
    address, _, port = where.rpartition(":")
    if not address or not port.isdigit():
        return False
    index, _ = reported_as(environ)
    try:
        gen = generation(environ)
    except PopdistError:
        gen = 0
    hello = f"{secret} {gen} {index or 0}\n".encode()
    _holder = threading.Thread(
        target=_hold, args=((address, int(port)), hello), name="popdist-lease", daemon=True
    )
    _holder.start()
    return True


def _hold(address: tuple[str, int], hello: bytes) -> None:
    """Connect (retrying until :data:`LEASE_S` passes), then beat and read renewals."""
    import socket  # here, on the lease's thread: ``import popdist`` stays free of it

    renewed = time.monotonic()
    sock = None
    while sock is None:
        try:
            sock = socket.create_connection(address, timeout=BEAT_S)
        except OSError:
            if time.monotonic() - renewed > LEASE_S:
                _end(f"cannot reach poprun's lease at {address[0]}:{address[1]}")
                return
            time.sleep(BEAT_S / 2)
    try:
        sock.sendall(hello)
        while True:
            try:
                sock.sendall(HEARTBEAT)
                data = sock.recv(4096)
            except TimeoutError:
                data = None
            except OSError:
                data = b""
            now = time.monotonic()
            if data == b"":
                _end("poprun ended this instance's lease")
                return
            if data:
                renewed = now
            elif now - renewed > LEASE_S and not _late_renewal(sock):
                _end(f"no word from poprun for {now - renewed:.0f} s (cut off from the job?)")
                return
    finally:
        sock.close()


def _late_renewal(sock: socket.socket) -> bool:
    """One last look (this process, or poprun, may just have been stopped and continued)."""
    try:
        sock.settimeout(2 * BEAT_S)
        return bool(sock.recv(4096))
    except OSError:
        return False
    finally:
        sock.settimeout(BEAT_S)


def _end(why: str) -> None:
    """One line on stderr, then SIGKILL to this instance's process group (or itself)."""
    index, host = reported_as(os.environ)
    gen = os.environ.get(GENERATION, "0")
    try:
        sys.stderr.write(
            f"popdist: instance {index} on {host} (generation {gen}): {why}: ending it\n"
        )
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    daemon = _ancestor("orted")  # on another host: Open MPI's daemon there, cut off too
    if daemon is not None:
        os.kill(daemon, signal.SIGTERM)  # it ends what it started there, then itself
    group = os.getpgrp()
    if group != os.getpid() and _command(group) in _LAUNCHERS:
        group = 0
    if group:
        os.killpg(group, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


#: Open MPI's own processes: never in the group the instance kills.
_LAUNCHERS = ("orted", "mpirun", "orterun", "prterun")


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _ancestor(name: str, depth: int = 4) -> int | None:
    """The nearest ancestor called ``name`` (the wrappers sit between), within ``depth``."""
    pid = os.getpid()
    for _ in range(depth):
        pid = _parent(pid)
        if pid <= 1:
            return None
        if _command(pid) == name:
            return pid
    return None
