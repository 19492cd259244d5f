"""Which hosts are this machine: by name, and by any of its own addresses."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from poprun.plan.hosts import is_local, local_addresses

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.7", "::1"])
def test_loopback_is_local(host: str) -> None:
    assert is_local(host)


def test_own_name_is_local_and_others_are_not() -> None:
    assert is_local(socket.gethostname())
    assert not is_local("no-such-host-here")
    outside = ipaddress.ip_address("203.0.113.7")  # TEST-NET-3: never a local address
    assert outside not in local_addresses()
    assert not is_local(str(outside))
