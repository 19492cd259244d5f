"""The compact launch across namespace hosts (issue 53): every instance, on the host poprun
planned it on, gets the values the per-instance rendering gave it, whatever the contexts.

Each case launches ``tests/bin/where.py`` from h1 and compares what every instance saw (its
host's name, its ``POPDIST_*`` and ``CUDA_VISIBLE_DEVICES``) with
:func:`poprun.plan.environment.instance_values` of the same plan, the function the per-instance
rendering exported. The cases cover one context over three hosts, poprun's own host in the
middle of the list (two contexts: Open MPI maps its own host first within one), hosts of
different instance counts (a host file with ``slots=``: the wrapper walks the host list), a
context split inside a host (an instance with mpirun arguments of its own), and a user's
device pool. A remote instance's failure is still named exactly.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from popdist import env as contract
from poprun.config import run_config as cfg
from poprun.plan.environment import instance_values
from poprun.plan.topology import plan
from tests.multihost.hosts import Hosts
from tests.multihost.test_multihost import BIN, PY, poprun_on, views

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

NAMES = [*contract.ALL, "CUDA_VISIBLE_DEVICES", "OMPI_COMM_WORLD_RANK", "EXTRA"]


def _case(tmp_path: Path, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(poprun's options as :func:`poprun.config.run_config.build` takes them, the
    environment the case adds) of one case."""
    values: dict[str, Any] = {"num_instances": "6", "num_replicas": "12"}
    environ: dict[str, str] = {}
    if name == "slots":
        host_file = tmp_path / "hosts.txt"
        host_file.write_text("h1 slots=1\nh2 slots=3\nh3 slots=2\n")
        values.update(num_replicas="6", host_file=str(host_file))
    elif name == "pool":
        values["host"] = ["h1,h2,h3"]
        environ["CUDA_VISIBLE_DEVICES"] = "4,5,6,7"
    else:
        hosts = {"one context": "h1,h2,h3", "this host in the middle": "h2,h1,h3"}
        values.update(ipus_per_replica="2", host=[hosts.get(name, "h1,h2")])
    if name == "instance args":
        values["instance_mpi_local_args"] = ["4:-x EXTRA=4"]
    return values, environ


def _options(values: dict[str, Any]) -> list[str]:
    """The same options on poprun's command line."""
    out = []
    for key, value in values.items():
        for one in value if isinstance(value, list) else [value]:
            out.append(f"--{key.replace('_', '-')}={one}")
    return out


def _expected(values: dict[str, Any], environ: dict[str, str]) -> list[dict[str, str]]:
    """What the per-instance rendering exported to each instance of the same plan."""
    from poprun.plan.devices import device_pool

    config = cfg.build(dict(values), ("/bin/true",), {"PATH": "/usr/bin:/bin", **environ})
    pool = device_pool(environ)
    return [instance_values(config, p, pool) for p in plan(config).instances]


@pytest.mark.parametrize(
    "name", ["one context", "this host in the middle", "slots", "instance args", "pool"]
)
def test_every_instance_gets_its_values_on_its_planned_host(
    clean_hosts: Hosts, tmp_path: Path, name: str
) -> None:
    values, environ = _case(tmp_path, name)
    out = tmp_path / "views"
    out.mkdir()
    args = [*_options(values), PY, str(BIN / "where.py"), str(out), *NAMES]
    done = poprun_on(clean_hosts, *args, **environ)  # type: ignore[arg-type]
    assert done.returncode == 0, done.stdout
    seen = views(out)
    expected = _expected(values, environ)
    assert [v["instance"] for v in seen] == list(range(len(expected)))
    for view, values in zip(seen, expected, strict=True):
        seen_env: dict[str, str | None] = view["env"]  # type: ignore[assignment]
        got = {k: v for k, v in seen_env.items() if v is not None}
        assert got.pop("OMPI_COMM_WORLD_RANK") == str(view["instance"])  # rank = plan's index
        extra = got.pop("EXTRA", None)
        assert extra == ("4" if name == "instance args" and view["instance"] == 4 else None)
        shared = {k for k in got if k not in values}  # the job-wide names poprun exports by name
        assert shared <= {contract.BACKEND, contract.ERROR_RECORD, contract.PROGRESS}, shared
        assert {k: got[k] for k in values} == values, view
        assert view["host"] == values[contract.HOST]  # Open MPI ran it where poprun planned


def test_a_remote_instances_failure_is_named_with_its_code(
    clean_hosts: Hosts, tmp_path: Path
) -> None:
    done = poprun_on(
        clean_hosts, "--num-instances", "6", "--num-replicas", "6", "-H", "h2,h1,h3",
        "/bin/sh", str(BIN / "fail_one.sh"), "5", "7",
    )  # fmt: skip
    assert done.returncode == 7, done.stdout
    assert "poprun: instance 5 failed first: exit code 7 (host h3" in done.stdout
    assert "instance 5 is failing on purpose" in done.stdout


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(subprocess.call(["pytest", __file__, "-q"]))
