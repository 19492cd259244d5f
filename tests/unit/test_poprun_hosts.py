"""Which hosts are this machine: by name, and by any of its own addresses."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path

import pytest

from poprun.plan.fabric import local_devices
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


def test_the_host_source_is_the_list_or_the_file_never_both(tmp_path: Path) -> None:
    from poprun.errors import PoprunError
    from poprun.plan.hosts import HostFile, HostList, host_source

    listed = host_source({"host": ["n[0-1]", "gpu7"]})
    assert listed == HostList(("n[0-1]", "gpu7"))
    assert listed.hosts() == ("n0", "n1", "gpu7")
    path = tmp_path / "hosts"
    path.write_text("# rack 1\nnode[2-3]\n")
    from_file = host_source({"host_file": str(path)})
    assert from_file == HostFile(str(path)) and from_file.hosts() == ("node2", "node3")
    assert host_source({}) is None
    with pytest.raises(PoprunError, match="conflicts with -H/--host"):
        host_source({"host": ["a"], "host_file": str(path)})


def test_an_allocation_is_one_more_host_source() -> None:
    """The seam a scheduler's allocation (Slurm, issue 26) plugs into."""
    from poprun.plan.hosts import HostSource

    class Allocation:
        option = "SLURM_JOB_NODELIST"

        def hosts(self) -> tuple[str, ...]:
            return ("c1", "c2")

    source: HostSource = Allocation()
    assert source.hosts() == ("c1", "c2")


def test_fabric_devices_are_read_from_the_kernels_classes(tmp_path: Path) -> None:
    assert local_devices(str(tmp_path)) == []  # no class at all: no driver, no fabric
    (tmp_path / "sys/class/infiniband").mkdir(parents=True)
    assert local_devices(str(tmp_path)) == []  # a driver loaded with no device
    for name in ("mlx5_1", "mlx5_0"):
        (tmp_path / "sys/class/infiniband" / name).mkdir()
    (tmp_path / "sys/class/cxi/cxi0").mkdir(parents=True)
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kgni0").touch()
    assert local_devices(str(tmp_path)) == ["mlx5_0", "mlx5_1", "cxi0", "kgni0"]
