"""Golden tests of the mpirun argv, and the topology behind it."""

from __future__ import annotations

import os

import pytest

from poprun.config import run_config as cfg
from poprun.plan.mpirun import (
    ALLREDUCE_RULES,
    INSTANCE_WRAPPER,
    REMOTE_WRAPPER,
    WRAPPER,
    build_argv,
    mca_from_environment,
)
from poprun.plan.topology import plan, spread_numa

pytestmark = pytest.mark.unit

ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "BASH_FUNC_f%%": "() { :; }", "OMPI_X": "1"}


def _config(**cli: object) -> cfg.RunConfig:
    program = tuple(cli.pop("program", ("/bin/true",)))  # type: ignore[arg-type]
    return cfg.build(cli, program, ENV)


def _argv(config: cfg.RunConfig, numa: dict[str, int] | None = None, **kw: object) -> list[str]:
    options: dict[str, object] = {
        "mpirun": "mpirun",
        "forwarded": ["HOME", "PATH"],
        "is_root": False,
        "local_cpus": 2,
        "numactl": "numactl",
    }
    options.update(kw)
    return build_argv(config, plan(config, numa), **options)  # type: ignore[arg-type]


def _job(total: int, ipr: int, instances: int, offline: bool = False) -> list[str]:
    """The job-wide contract values, once a context."""
    uniform = int(total % instances == 0)
    out = ["-x", f"POPDIST_NUM_TOTAL_REPLICAS={total}", "-x", f"POPDIST_NUM_IPUS_PER_REPLICA={ipr}"]
    out += ["-x", f"POPDIST_UNIFORM_REPLICAS_PER_INSTANCE={uniform}"]
    out += ["-x", f"POPDIST_NUM_INSTANCES={instances}"]
    return out + (["-x", "POPDIST_OFFLINE_MODE=1"] if offline else [])


def _wrapper(
    hosts: str, first: int = 0, first_local: int = 0, each: int | None = None, local: int = 1,
    numa: int = 0, pool: str = "o", numactl: str = "",
) -> list[str]:  # fmt: skip
    """The instance wrapper and its compact plan (poprun.plan.compact's module doc)."""
    if each is None:
        counts = {h.rsplit(":", 1)[1] for h in hosts.split(",")}
        each = int(counts.pop()) if len(counts) == 1 else 0
    numbers = f"{first} {first_local} {each} {local} {numa}"
    return [*INSTANCE_WRAPPER, numbers, hosts, pool, numactl]


def _contexts(argv: list[str]) -> list[str]:
    """Each app context as one line (split at the ``:`` words)."""
    out: list[list[str]] = [[]]
    for arg in argv:
        if arg == ":":
            out.append([])
        else:
            out[-1].append(arg)
    return [" ".join(words) for words in out]


HEAD = ["mpirun", "--tag-output", "--bind-to", "none"]
RULES = [
    *("--mca", "coll_tuned_use_dynamic_rules", "1"),
    *("--mca", "coll_tuned_dynamic_rules_filename", ALLREDUCE_RULES),
]
SHM = ["--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp", *RULES]  # single-host defaults
YIELD = ["--mca", "mpi_yield_when_idle", "1"]  # ... when threads outnumber the cores
FORWARD = [
    *("-x", "HOME", "-x", "PATH", "-x", "POPDIST_BACKEND", "-x", "POPDIST_ERROR_RECORD"),
    *("-x", "POPDIST_PROGRESS", "-x", "PYTHONUNBUFFERED"),
]


def test_one_by_one() -> None:
    argv = _argv(_config(program=("sh", "train.sh", "--lr", "0.1")))
    assert argv == [
        *HEAD,
        *SHM,
        "-np",
        "1",
        *FORWARD,
        *_job(1, 1, 1),
        *_wrapper("localhost:1"),
        "sh",
        "train.sh",
        "--lr",
        "0.1",
    ]


def test_four_replicas_on_two_instances_as_root_are_one_context() -> None:
    argv = _argv(_config(num_replicas="4", num_instances="2"), is_root=True)
    assert argv == [
        *HEAD,
        "--allow-run-as-root",
        *SHM,
        *YIELD,
        *["-np", "2", *FORWARD, *_job(4, 1, 2)],
        *[*_wrapper("localhost:2"), "/bin/true"],
    ]


@pytest.mark.parametrize(
    ("instances", "cpus", "yields"), [(1, 2, False), (2, 2, True), (2, 4, False), (3, 4, True)]
)
def test_waiting_mpi_yields_when_instance_threads_outnumber_cores(
    instances: int, cpus: int, yields: bool
) -> None:
    config = _config(num_replicas=str(instances), num_instances=str(instances))
    argv = _argv(config, local_cpus=cpus)
    assert ("mpi_yield_when_idle" in argv) is yields
    # The user's own choice wins.
    user = _argv(config, local_cpus=cpus, user_mca=frozenset({"mpi_yield_when_idle"}))
    assert "mpi_yield_when_idle" not in user


def test_eight_replicas_on_four_instances_over_two_host_ranges() -> None:
    config = _config(
        num_replicas="8",
        num_instances="4",
        ipus_per_replica="2",
        host=["node[0-1]"],
        mpi_global_args=["--mca btl_tcp_if_include 'eth0'"],
        process_placement="disabled",
    )
    argv = _argv(config, local_cpus=4)
    assert argv == [
        *HEAD,
        *("--mca", "btl_tcp_if_include", "eth0"),
        *("-np", "4", "-H", "node0:2,node1:2", *FORWARD, *_job(8, 2, 4)),
        *_wrapper("node0:2,node1:2", local=0),  # other hosts: the exit status wrapper
        "/bin/true",
    ]


def test_a_context_starts_at_this_hosts_instances() -> None:
    """Open MPI maps its own host first within a context: a context starts there, so the
    ranks keep the plan's order, and only a context's first host can be this one."""
    config = _config(num_replicas="6", num_instances="6", host=["node1,localhost,node2"])
    argv = _argv(config, local_cpus=8)
    contexts = _contexts(argv)
    assert len(contexts) == 2
    assert " -np 2 -H node1:2 " in contexts[0] and contexts[0].endswith(
        " ".join(["0 0 2 0 0", "node1:2", "o", "", "/bin/true"])
    )
    assert contexts[1].startswith("-np 4 -H localhost:2,node2:2 ")
    assert contexts[1].endswith(
        " ".join(["2 0 2 1 0", "localhost:2,node2:2", "o", "", "/bin/true"])
    )


def test_only_instances_on_this_host_take_the_local_wrapper() -> None:
    config = _config(num_replicas="2", num_instances="2", host=["localhost,node1"])
    argv = _argv(config, local_cpus=4)
    at = argv.index(INSTANCE_WRAPPER[2])
    assert argv[at + 2 : at + 5] == ["0 0 1 1 0", "localhost:1,node1:1", "o"]
    # The wrapper takes the local path only for the context's first host (entry 0) when
    # LOCAL is 1; every other instance gets the remote wrapper's script.
    assert INSTANCE_WRAPPER[2].index(WRAPPER[2]) < INSTANCE_WRAPPER[2].index(REMOTE_WRAPPER[2])
    assert argv[-1] == "/bin/true" and argv.count(INSTANCE_WRAPPER[2]) == 1


def test_every_context_forwards_the_environment_by_name() -> None:
    # Open MPI 4.1 applies a -x before the first context to that context only.
    config = _config(num_replicas="3", num_instances="3", host=["a,localhost,c"])
    argv = _argv(config, forwarded=["HOME", "MY_VAR"], local_cpus=4)
    contexts = _contexts(argv)
    assert len(contexts) == 2
    shared = (
        "-x HOME -x MY_VAR -x POPDIST_BACKEND -x POPDIST_ERROR_RECORD -x POPDIST_PROGRESS "
        "-x PYTHONUNBUFFERED -x POPDIST_NUM_TOTAL_REPLICAS=3"
    )
    for context in contexts:
        assert shared in context
    assert argv.index("-x") > argv.index("-np")


@pytest.mark.parametrize(
    ("hosts", "instances", "cpus", "yields"),
    [("a,b", 2, 2, False), ("a,b", 4, 2, True), ("a,b", 4, 4, False), ("a,b,c", 6, 2, True)],
)
def test_waiting_mpi_yields_when_a_host_is_oversubscribed(
    hosts: str, instances: int, cpus: int, yields: bool
) -> None:
    config = _config(num_replicas=str(instances), num_instances=str(instances), host=[hosts])
    argv = _argv(config, local_cpus=cpus)
    assert ("mpi_yield_when_idle" in argv) is yields
    assert "pml" not in argv  # several hosts: Open MPI picks the transports itself
    user = _argv(config, local_cpus=cpus, user_mca=frozenset({"mpi_yield_when_idle"}))
    assert "mpi_yield_when_idle" not in user


def test_per_instance_local_args_keep_their_quoting() -> None:
    config = _config(
        num_replicas="3",
        num_instances="3",
        mpi_local_args=["-x A=1"],
        instance_mpi_local_args=['1:-x B="two words"', "1:--wdir /tmp"],
    )
    argv = _argv(config)
    colons = [i for i, arg in enumerate(argv) if arg == ":"]
    assert len(colons) == 2  # instance 1 has arguments of its own: a context of its own
    first, second, third = argv[: colons[0]], argv[colons[0] : colons[1]], argv[colons[1] :]
    at = first.index(INSTANCE_WRAPPER[0])
    assert first[at - 2 : at] == ["-x", "A=1"]
    assert first[at + 4 : at + 6] == ["0 0 3 1 0", "localhost:3"]
    at = second.index(INSTANCE_WRAPPER[0])
    assert second[at - 6 : at] == ["-x", "A=1", "-x", "B=two words", "--wdir", "/tmp"]
    assert second[second.index("-np") + 1] == "1" and second[at + 4] == "1 1 3 1 0"
    at = third.index(INSTANCE_WRAPPER[0])
    assert third[at - 2 : at] == ["-x", "A=1"] and third[at + 4] == "2 2 3 1 0"


@pytest.mark.parametrize("placement", ["spreadnuma", "disabled"])
def test_placement_on_and_off(placement: str) -> None:
    config = _config(num_replicas="4", num_instances="4", process_placement=placement)
    argv = _argv(config, numa={"localhost": 2})
    assert "--oversubscribe" in argv  # 4 instances > 2 cpus
    at = argv.index(INSTANCE_WRAPPER[2]) + 2
    if placement == "spreadnuma":  # the wrapper binds each to its node(s) with numactl
        assert argv[at:] == ["0 0 4 1 2", "localhost:4", "o", "numactl", "/bin/true"]
    else:
        assert argv[at:] == ["0 0 4 1 0", "localhost:4", "o", "", "/bin/true"]


@pytest.mark.parametrize(
    ("hosts", "fabric_here", "user", "tcp"),
    [
        ("localhost,node1", False, {}, True),  # this host is in the job and has no fabric
        ("localhost,node1", True, {}, False),  # a fabric here: Open MPI finds it
        ("node0,node1", False, {}, False),  # launched from outside the job: nothing known
        ("localhost,node1", False, {"user_mca": frozenset({"pml"})}, False),  # OMPI_MCA_pml
    ],
)
def test_hosts_without_a_fabric_take_the_tcp_path_directly(
    hosts: str, fabric_here: bool, user: dict[str, object], tcp: bool
) -> None:
    config = _config(num_replicas="2", num_instances="2", host=[hosts])
    argv = _argv(config, local_cpus=4, fabric_here=fabric_here, **user)
    assert (argv[4:7] == ["--mca", "pml", "ob1"]) is tcp
    assert "pml" not in argv[7:] and "btl" not in argv  # the btl choice stays Open MPI's
    chosen = _config(num_replicas="2", num_instances="2", host=[hosts],
                     mpi_global_args=["--mca pml ucx"])  # fmt: skip
    argv = _argv(chosen, local_cpus=4, fabric_here=fabric_here)
    assert argv.count("pml") == 1 and argv[argv.index("pml") + 1] == "ucx"


def test_user_binding_replaces_the_default() -> None:
    argv = _argv(_config(mpi_global_args=["--bind-to core"]))
    assert argv[:16] == ["mpirun", "--tag-output", *SHM, "--bind-to", "core"]


def test_user_mca_choices_replace_the_single_host_defaults() -> None:
    argv = _argv(_config(mpi_global_args=["--mca pml ucx"]))
    assert argv[4:16] == ["--mca", "btl", "self,vader,tcp", *RULES, "--mca", "pml", "ucx"]
    argv = _argv(_config(mpi_local_args="-mca btl self,tcp"))
    assert argv[4:7] == ["--mca", "pml", "ob1"] and argv.count("btl") == 1
    argv = _argv(_config(), user_mca=frozenset({"pml", "btl"}))
    assert argv[4:10] == RULES and argv.count("--mca") == 2  # only the allreduce rules


def test_any_collective_choice_of_the_user_replaces_the_allreduce_rules() -> None:
    assert os.path.isfile(ALLREDUCE_RULES)  # shipped with the package (pyproject's package-data)
    for chosen in ({"coll_tuned_allreduce_algorithm"}, {"coll"}, {"coll_tuned_use_dynamic_rules"}):
        argv = _argv(_config(), user_mca=frozenset(chosen))
        assert "coll_tuned_dynamic_rules_filename" not in argv and argv[4:10] == SHM[:6]
    argv = _argv(_config(mpi_global_args=["--mca coll_tuned_allreduce_algorithm 4"]))
    assert argv.count("--mca") == 3 and "coll_tuned_use_dynamic_rules" not in argv


def test_mca_names_from_the_environment() -> None:
    environ = {"OMPI_MCA_pml": "ucx", "OMPI_MCA_btl_vader_x": "1", "OMPI_X": "1", "PATH": "/b"}
    assert mca_from_environment(environ) == {"pml", "btl_vader_x"}


def test_host_subnet_maps_to_interface_selection() -> None:
    argv = _argv(_config(host_subnet="10.5.0.0/16"))
    assert argv[4:16] == SHM
    assert argv[16:22] == [
        "--mca",
        "btl_tcp_if_include",
        "10.5.0.0/16",
        "--mca",
        "oob_tcp_if_include",
        "10.5.0.0/16",
    ]


def test_cache_path_goes_by_name() -> None:
    argv = _argv(_config(executable_cache_path="/tmp/with space"))
    assert argv[16:32] == [
        "-np",
        "1",
        "-x",
        "HOME",
        "-x",
        "PATH",
        "-x",
        "POPDIST_BACKEND",
        "-x",
        "POPDIST_ERROR_RECORD",
        "-x",
        "POPDIST_EXECUTABLE_CACHE_PATH",
        "-x",
        "POPDIST_PROGRESS",
        "-x",
        "PYTHONUNBUFFERED",
    ]
    assert not any("with space" in a for a in argv)


@pytest.mark.parametrize(
    ("local", "count", "nodes", "expected"),
    [(0, 1, 2, (0, 1)), (1, 2, 4, (2, 3)), (3, 4, 2, (1,)), (0, 2, 1, ())],
)
def test_spread_numa(local: int, count: int, nodes: int, expected: tuple[int, ...]) -> None:
    assert spread_numa(local, count, nodes) == expected


def test_topology_fills_host_by_host() -> None:
    topo = plan(_config(num_replicas="8", num_instances="4", ipus_per_replica="2", host=["a,b"]))
    assert [(p.host, p.local_index, p.replica_offset) for p in topo.instances] == [
        ("a", 0, 0),
        ("a", 1, 2),
        ("b", 0, 4),
        ("b", 1, 6),
    ]
    assert list(topo.instances[3].devices) == [12, 13, 14, 15]


def test_deterministic_reduction_goes_by_name_only_when_asked() -> None:
    from poprun.plan.environment import shared_values

    assert "POPDIST_DETERMINISTIC_REDUCTION" not in shared_values(_config())
    config = _config(deterministic_reduction="yes")
    assert config.deterministic_reduction is True
    assert shared_values(config)["POPDIST_DETERMINISTIC_REDUCTION"] == "1"
    assert "POPDIST_DETERMINISTIC_REDUCTION" in _argv(config)
    assert config.to_file_values()["deterministic-reduction"] is True
