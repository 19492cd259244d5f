"""The lease (poprun.run.membership.lease and popdist.lease) on loopback, in one process:
the server renews only its job's current generation; the instance's side ends the instance
when the renewals stop or poprun closes the connection."""

from __future__ import annotations

import socket
import threading
import time

import pytest

import popdist.lease as instance_lease
import poprun.run.membership.lease as server_lease
from poprun.run.membership.lease import LeaseServer, facing_address

pytestmark = pytest.mark.unit

SECRET = "s3cret"
RENEW_S = 0.1


@pytest.fixture(autouse=True)
def _quick_renewals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_lease, "RENEW_S", RENEW_S)


def _connect(server: LeaseServer, hello: bytes) -> socket.socket:
    host, port = server.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=3 * RENEW_S)
    sock.sendall(hello)
    return sock


def _wait(condition: object, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_the_server_renews_its_instances_and_hears_them() -> None:
    server = LeaseServer("127.0.0.1", SECRET)
    try:
        sock = _connect(server, f"{SECRET} 0 2\n".encode() + instance_lease.HEARTBEAT)
        assert sock.recv(16).startswith(b"r\n")  # a renewal within RENEW_S
        assert _wait(lambda: 2 in server.heard)
        sock.close()
    finally:
        server.close()


@pytest.mark.parametrize("hello", [b"wrong 0 1\n", b"s3cret 7 1\n", b"s3cret zero 1\n"])
def test_a_stranger_or_an_older_generation_is_dropped(hello: bytes) -> None:
    server = LeaseServer("127.0.0.1", SECRET)
    try:
        sock = _connect(server, hello)
        assert sock.recv(16) == b""  # closed, no renewal
        assert server.heard == {}
    finally:
        server.close()


def test_a_new_generation_closes_the_old_leases() -> None:
    server = LeaseServer("127.0.0.1", SECRET)
    try:
        sock = _connect(server, f"{SECRET} 0 1\n".encode())
        assert sock.recv(16).startswith(b"r")
        server.begin(1)
        deadline = time.monotonic() + 3
        while (data := sock.recv(16)) and time.monotonic() < deadline:
            assert data.strip(b"r\n") == b""
        assert data == b""
    finally:
        server.close()


def test_facing_address_is_the_route_source() -> None:
    assert facing_address(["127.0.0.1"]) == "127.0.0.1"
    assert facing_address(["no-such-host.invalid"]) is None


def _hold(monkeypatch: pytest.MonkeyPatch, server_address: tuple[str, int]) -> list[str]:
    ended: list[str] = []
    monkeypatch.setattr(instance_lease, "_end", ended.append)
    monkeypatch.setattr(instance_lease, "LEASE_S", 0.6)
    monkeypatch.setattr(instance_lease, "BEAT_S", 0.1)
    thread = threading.Thread(
        target=instance_lease._hold, args=(server_address, b"s 0 0\n"), daemon=True
    )
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    return ended


def test_the_instance_ends_when_the_renewals_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    kept: list[socket.socket] = []

    def accept_and_stay_silent() -> None:
        conn, _ = listener.accept()
        kept.append(conn)  # never renews, never closes: a cut

    threading.Thread(target=accept_and_stay_silent, daemon=True).start()
    ended = _hold(monkeypatch, listener.getsockname())
    assert len(ended) == 1 and "no word from poprun" in ended[0]
    listener.close()


def test_the_instance_ends_when_poprun_closes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def accept_and_close() -> None:
        conn, _ = listener.accept()
        conn.close()

    threading.Thread(target=accept_and_close, daemon=True).start()
    ended = _hold(monkeypatch, listener.getsockname())
    assert ended == ["poprun ended this instance's lease"]
    listener.close()


def test_an_unreachable_poprun_ends_the_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = probe.getsockname()
    ended = _hold(monkeypatch, address)
    assert len(ended) == 1 and "cannot reach poprun's lease" in ended[0]


def test_no_lease_without_poprun_asking() -> None:
    assert instance_lease.start_if_asked({}) is False
    assert instance_lease.start_if_asked({"POPDIST_LEASE": "x:1"}) is False  # no secret
