"""poprun's side of the lease: the renewals that keep the instances of a multi-host job alive.

A host cut off from poprun must not go on as a second job. Every instance of a job across
hosts run with ``--min-hosts`` holds a lease (:mod:`popdist.lease`): it connects to this server at ``import popdist``,
says who it is with the job's secret and generation, and then gets a renewal every
:data:`RENEW_S`; it sends a heartbeat back as often, which tells poprun the host is there
(:mod:`poprun.run.membership.watch`). An instance that has had no renewal for
:data:`popdist.lease.LEASE_S` ends itself. A connection from an older generation (an
instance of an attempt poprun has ended) is closed at once, which ends that instance too.

The port binds to the one address of this host that the other hosts reach it on (the
source address of the route to the first remote host), not to every interface: instances on
other hosts must connect to it, so loopback cannot serve, and nothing else needs it. What
connects without the job's secret is dropped.
"""

from __future__ import annotations

import contextlib
import hmac
import selectors
import socket
import threading
import time
from collections.abc import Callable

#: How often poprun renews every lease (seconds).
RENEW_S = 1.0
#: A connection that has not said who it is after this long is dropped.
_HELLO_S = 5.0


def facing_address(hosts: list[str]) -> str | None:
    """This host's address on the route to the first of ``hosts`` that resolves (no packet
    is sent: a UDP socket's ``connect`` only picks the route), or None."""
    for host in hosts:
        try:
            infos = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)
        except OSError:
            continue
        for *_, address in infos:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                try:
                    probe.connect(address)
                    return str(probe.getsockname()[0])
                except OSError:
                    continue
    return None


class LeaseServer:
    """The renewals, on a daemon thread; :attr:`heard` is each instance's last heartbeat."""

    def __init__(
        self, address: str, secret: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.secret = secret.encode()
        self.clock = clock
        self.generation = 0
        #: Instance index → when its last heartbeat arrived (this generation's instances).
        self.heard: dict[int, float] = {}
        self._fresh: dict[int, float] = {}  # ... those since the last take_heard()
        self._listener = socket.create_server((address, 0))
        self._listener.setblocking(False)
        self.address = f"{address}:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._clients: dict[socket.socket, tuple[float, int | None, bytes]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="poprun-lease", daemon=True)
        self._thread.start()

    def begin(self, generation: int) -> None:
        """A new attempt: only instances of ``generation`` hold a lease from now on."""
        with self._lock:
            self.generation = generation
            self.heard, self._fresh = {}, {}
            for client in list(self._clients):
                self._drop(client)

    def take_heard(self) -> dict[int, float]:
        """The heartbeats since the last call: instance → when its latest arrived."""
        with self._lock:
            fresh, self._fresh = self._fresh, {}
            return fresh

    def close(self) -> None:
        """Stop renewing: every instance still connected sees the end of its lease."""
        self._stop.set()
        self._thread.join(timeout=2 * RENEW_S)
        with self._lock:
            for client in list(self._clients):
                self._drop(client)
        self._listener.close()

    def _drop(self, client: socket.socket) -> None:
        self._clients.pop(client, None)
        with contextlib.suppress(OSError):
            client.close()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        renewed = 0.0
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(RENEW_S / 4):
                    if key.fileobj is self._listener:
                        self._accept(selector)
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                if self.clock() - renewed >= RENEW_S:
                    renewed = self.clock()
                    self._renew()
                with self._lock:  # forget the connections dropped since (any thread)
                    gone = [k.fileobj for k in selector.get_map().values()
                            if k.fileobj is not self._listener and k.fileobj not in self._clients]  # fmt: skip
                for client in gone:
                    selector.unregister(client)
        finally:
            selector.close()

    def _accept(self, selector: selectors.BaseSelector) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            client, _ = self._listener.accept()
            client.setblocking(False)
            with self._lock:
                self._clients[client] = (self.clock(), None, b"")
            selector.register(client, selectors.EVENT_READ)

    def _read(self, client: socket.socket) -> None:
        try:
            data = client.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        with self._lock:
            if client not in self._clients:
                data = b""
            if not data:
                self._drop(client)
                return
            since, instance, pending = self._clients[client]
            if instance is None:
                pending += data
                if b"\n" not in pending:
                    self._clients[client] = (since, None, pending[-256:])
                    return
                instance = self._hello(pending.split(b"\n", 1)[0])
                if instance is None:
                    self._drop(client)
                    return
            self._clients[client] = (since, instance, b"")
            self.heard[instance] = self._fresh[instance] = self.clock()

    def _hello(self, line: bytes) -> int | None:
        """``SECRET GENERATION INSTANCE``: the instance's index, or None (not ours, or old)."""
        words = line.split()
        if len(words) != 3 or not hmac.compare_digest(words[0], self.secret):
            return None
        if not (words[1].isdigit() and words[2].isdigit()):
            return None
        if int(words[1]) != self.generation:
            return None
        return int(words[2])

    def _renew(self) -> None:
        now = self.clock()
        with self._lock:
            for client, (since, instance, _) in list(self._clients.items()):
                if instance is None:
                    if now - since > _HELLO_S:
                        self._drop(client)
                    continue
                try:
                    client.send(b"r\n")
                except BlockingIOError:
                    pass  # its buffer is full: it is not reading; its lease runs out
                except OSError:
                    self._drop(client)
