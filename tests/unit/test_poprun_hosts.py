"""Which hosts are this machine: by name, and by any of its own addresses."""

from __future__ import annotations

import ipaddress
import socket
import subprocess

import pytest

from poprun.plan.hosts import is_local, local_addresses

pytestmark = pytest.mark.unit


def _addresses_ip_reports() -> set[str]:
    """This machine's addresses as ``ip -o addr`` lists them (a second, independent source)."""
    try:
        out = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    except OSError:
        pytest.skip("ip is not installed")
    return {line.split()[3].split("/")[0] for line in out.splitlines() if len(line.split()) > 3}


def test_own_addresses_are_local() -> None:
    reported = _addresses_ip_reports()
    assert reported, "ip -o addr listed no address"
    assert {str(a) for a in local_addresses()} >= {a.split("%")[0] for a in reported}
    for address in reported:
        assert is_local(address), address


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.7", "::1"])
def test_loopback_is_local(host: str) -> None:
    assert is_local(host)


def test_own_name_is_local_and_others_are_not() -> None:
    assert is_local(socket.gethostname())
    assert not is_local("no-such-host-here")
    outside = ipaddress.ip_address("203.0.113.7")  # TEST-NET-3: never a local address
    assert outside not in local_addresses()
    assert not is_local(str(outside))
