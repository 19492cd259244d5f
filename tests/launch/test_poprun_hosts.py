"""This machine's own addresses are local, checked against ``ip -o addr`` (a process)."""

from __future__ import annotations

import subprocess

import pytest

from poprun.plan.hosts import is_local, local_addresses

pytestmark = pytest.mark.launch


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
