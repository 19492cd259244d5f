"""The compact launch plan (issue 53): every instance's values from its rank and a plan the
size of the host list, exactly as the per-instance rendering it replaced gave them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from poprun.config import run_config as cfg
from poprun.plan import compact
from poprun.plan.environment import instance_values
from poprun.plan.mpirun import build_argv
from poprun.plan.topology import on_hosts, plan

pytestmark = pytest.mark.unit

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/u"}
SLURM = {
    **ENV,
    "SLURM_JOB_ID": "17",
    "SLURM_JOB_NODELIST": "n[1-3]",
    "SLURM_TASKS_PER_NODE": "2(x2),3",
    "SLURM_JOB_CPUS_PER_NODE": "3(x3)",
    "SLURM_NNODES": "3",
}
#: Linux's limit on one argv string (MAX_ARG_STRLEN), and the goal for the whole argv.
ONE_STRING = 32 * 4096
ARGV_GOAL = 128 * 1024


def _config(environ: dict[str, str] | None = None, **cli: object) -> cfg.RunConfig:
    return cfg.build(cli, ("/bin/true",), environ or ENV)


def _cases() -> list[tuple[str, cfg.RunConfig, dict[str, int] | None]]:
    """(name, config, NUMA nodes per host) over instances, replicas, hosts, uneven splits."""
    cases: list[tuple[str, cfg.RunConfig, dict[str, int] | None]] = []
    for n in (1, 2, 3, 4, 8):
        for per in (1, 2, 3):
            for ipr in (1, 2):
                config = _config(
                    num_instances=str(n), num_replicas=str(n * per), ipus_per_replica=str(ipr)
                )
                cases.append((f"{n}x{per}x{ipr}", config, None))
    for hosts, n in (("a,b", 2), ("a,b", 6), ("node[0-3]", 8), ("a,localhost,c", 6)):
        config = _config(num_instances=str(n), num_replicas=str(2 * n), host=[hosts])
        cases.append((f"{hosts}/{n}", config, None))
    four = _config(num_instances="8", num_replicas="8", host=["h[1-4]"])
    cases.append(("uneven: 8 replicas on 3 of 4 hosts", on_hosts(four, ("h1", "h3", "h4")), None))
    six = _config(num_instances="6", num_replicas="12", host=["localhost,b,c"])
    cases.append(("uneven: 12 replicas, local host lost", on_hosts(six, ("b", "c")), None))
    cases.append(("slurm: 2, 2, 3 tasks", _config(SLURM, num_replicas="14"), None))
    lost = on_hosts(_config(SLURM, num_replicas="7"), ("n1", "n3"))
    cases.append(("slurm: 7 replicas on 2 and 3 tasks", lost, None))
    for placement in ("spreadnuma", "disabled"):
        for n in (1, 2, 3, 6):
            config = _config(num_instances=str(n), num_replicas=str(n), process_placement=placement)
            cases.append((f"numa {placement} {n}", config, {"localhost": 4}))
    args = _config(
        num_instances="6", num_replicas="6", host=["a,b"],
        instance_mpi_local_args=["1:--wdir /tmp", "4:--wdir /tmp"],
    )  # fmt: skip
    cases.append(("instance args", args, None))
    return cases


POOLS: tuple[tuple[str, ...] | None, ...] = (None, ("4", "5", "6", "7", "8", "9", "10", "11"), ())


@pytest.mark.parametrize(("name", "config", "numa"), _cases(), ids=[c[0] for c in _cases()])
@pytest.mark.parametrize("pool", POOLS, ids=["ordinals", "pool", "no devices"])
def test_every_instance_gets_what_the_per_instance_rendering_gave(
    name: str,
    config: cfg.RunConfig,
    numa: dict[str, int] | None,
    pool: tuple[str, ...] | None,
) -> None:
    topology = plan(config, numa)
    launch = compact.plan_launch(config, topology, pool, "numactl")
    shared = compact.job_values(launch)
    for today in topology.instances:
        assert compact.instance_plan(launch, today.index) == today
        values = compact.instance_values(launch, today.index)
        assert values == instance_values(config, today, pool)
        assert {k: values[k] for k in shared} == shared  # job-wide means the same for all
    assert sum(c.instances for c in launch.contexts) == len(topology.instances)


def test_the_wrapper_exports_exactly_the_values_that_differ_between_instances() -> None:
    config = _config(num_instances="2", num_replicas="2", offline_mode="yes")
    values = compact.instance_values(compact.plan_launch(config, plan(config)), 1)
    exported = compact.DERIVE.split("export ", 1)[1].split(";", 1)[0]
    names = {word.split("=", 1)[0] for word in exported.split()}
    assert names == set(values) - set(compact.JOB_WIDE)
    assert set(compact.job_values(compact.plan_launch(config, plan(config)))) == {
        *compact.JOB_WIDE
    }  # offline mode is one of them when on


def _argv_bytes(argv: Sequence[str]) -> int:
    return sum(len(arg.encode()) + 1 for arg in argv)


@pytest.mark.parametrize(("hosts", "per_host"), [(2048, 8), (1024, 16), (64, 8), (2, 1)])
def test_the_command_stays_small_whatever_the_job(hosts: int, per_host: int) -> None:
    """The issue's measurement (8 instances a host, 2 replicas an instance): the per-context
    rendering was 1.6 MB at 1,024 instances (E2BIG); the compact one grows by a host's name
    and count, twice (in ``-H`` and the wrapper's plan)."""
    n = hosts * per_host
    config = _config(num_instances=str(n), num_replicas=str(2 * n), host=[f"node[0-{hosts - 1}]"])
    forwarded = [f"SOME_VARIABLE_{i}" for i in range(40)]  # a user's environment, by name
    argv = build_argv(
        config, plan(config), mpirun="/usr/bin/mpirun", forwarded=forwarded, is_root=False,
        local_cpus=2,
    )  # fmt: skip
    assert _argv_bytes(argv) <= ARGV_GOAL
    assert max(len(arg.encode()) for arg in argv) < ONE_STRING
    assert argv.count(":") == 0  # one context: nothing on this host, no per-instance args


def test_contexts_start_at_this_host_and_at_other_arguments() -> None:
    config = _config(
        num_instances="6", num_replicas="6", host=["a,localhost,c"],
        instance_mpi_local_args=["5:--wdir /tmp"],
    )  # fmt: skip
    launch = compact.plan_launch(config, plan(config))
    shapes = [(c.first, c.instances, c.hosts, c.first_local, c.local) for c in launch.contexts]
    assert shapes == [
        (0, 2, (("a", 2),), 0, False),
        (2, 3, (("localhost", 2), ("c", 2)), 0, True),
        (5, 1, (("c", 2),), 1, False),  # c's second instance: the same host, its own args
    ]
    assert compact.wrapper_args(launch, launch.contexts[2]) == ["5 1 2 0 0", "c:2", "o", ""]
    assert launch.contexts[2].local_args == ("--wdir", "/tmp")


def test_a_rank_outside_the_job_is_refused() -> None:
    config = _config(num_instances="2", num_replicas="2")
    launch = compact.plan_launch(config, plan(config))
    with pytest.raises(ValueError, match="rank 2 is not one of the job's 2 instances"):
        compact.instance_plan(launch, 2)
