"""The environment contract: round trip, Open MPI fallback, and every malformed case."""

from __future__ import annotations

import pytest

from popdist import env
from popdist.env import PopdistError, RunView, instance_environment, read_run

pytestmark = pytest.mark.unit


def _poprun(total: int = 8, instances: int = 4, index: int = 1, **kw: object) -> dict[str, str]:
    return instance_environment(
        num_total_replicas=total,
        num_ipus_per_replica=kw.pop("ipr", 2),  # type: ignore[arg-type]
        num_instances=instances,
        instance_index=index,
        local_instance_index=kw.pop("local_index", index % 2),  # type: ignore[arg-type]
        num_local_instances=kw.pop("local_count", 2),  # type: ignore[arg-type]
        host=kw.pop("host", "node-a"),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def test_nothing_set_is_one_process_one_replica() -> None:
    assert read_run({}) == RunView()
    view = read_run({})
    assert (view.num_instances, view.instance_index, view.num_total_replicas) == (1, 0, 1)
    assert (view.num_local_replicas, view.replica_index_offset, view.from_poprun) == (1, 0, False)


def test_poprun_round_trip_every_instance() -> None:
    for index in range(4):
        view = read_run(_poprun(index=index, offline_mode=True, executable_cache_path="/c"))
        assert view == RunView(
            num_total_replicas=8,
            num_ipus_per_replica=2,
            num_local_replicas=2,
            replica_index_offset=2 * index,
            local_instance_index=index % 2,
            num_instances=4,
            instance_index=index,
            num_local_instances=2,
            host="node-a",
            offline_mode=True,
            executable_cache_path="/c",
            from_poprun=True,
        )


def test_instance_environment_has_poprun_six_first() -> None:
    names = list(_poprun())
    assert names[:6] == list(env.REQUIRED)
    assert set(names) <= set(env.ALL)
    assert _poprun(index=3)[env.REPLICA_INDEX_OFFSET] == "6"


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"total": 7}, "num_total_replicas=7 must be a positive multiple of num_instances=4"),
        ({"index": 4}, r"instance_index=4 must be in \[0, 4\)"),
    ],
)
def test_instance_environment_rejects_impossible_runs(kw: dict[str, int], needle: str) -> None:
    with pytest.raises(PopdistError, match=needle):
        _poprun(**kw)  # type: ignore[arg-type]


def test_ompi_fallback_one_replica_per_rank() -> None:
    view = read_run(
        {
            env.OMPI_SIZE: "3",
            env.OMPI_RANK: "2",
            env.OMPI_LOCAL_RANK: "0",
            env.OMPI_LOCAL_SIZE: "1",
        }
    )
    assert (view.num_instances, view.instance_index, view.num_total_replicas) == (3, 2, 3)
    assert (view.num_local_replicas, view.replica_index_offset, view.from_poprun) == (1, 2, False)


def test_poprun_set_wins_over_ompi() -> None:
    environ = {**_poprun(index=2), env.OMPI_SIZE: "4", env.OMPI_RANK: "0"}
    assert read_run(environ).instance_index == 2


def _without(name: str) -> dict[str, str]:
    environ = _poprun()
    del environ[name]
    return environ


def _with(**changes: str) -> dict[str, str]:
    environ = _poprun()
    for key, value in changes.items():
        environ[getattr(env, key)] = value
    return environ


MALFORMED = [
    # a missing variable: named, with a present one and its value
    (
        _without(env.REPLICA_INDEX_OFFSET),
        "POPDIST_REPLICA_INDEX_OFFSET is not set but POPDIST_NUM_TOTAL_REPLICAS='8' is: the "
        "POPDIST_* environment is half set; launch with poprun, or unset every POPDIST_* "
        "variable to run alone",
    ),
    (
        {env.NUM_LOCAL_REPLICAS: "2"},
        "POPDIST_NUM_TOTAL_REPLICAS is not set but POPDIST_NUM_LOCAL_REPLICAS='2' is",
    ),
    (
        {env.INSTANCE_INDEX: "1"},
        "POPDIST_NUM_TOTAL_REPLICAS is not set but POPDIST_INSTANCE_INDEX='1' is",
    ),
    # a non-integer, a negative, a zero
    (
        _with(NUM_TOTAL_REPLICAS="eight"),
        "POPDIST_NUM_TOTAL_REPLICAS='eight' is not an integer: the launcher sets it, so "
        "relaunch with poprun (or mpirun), or unset it to run alone",
    ),
    (_with(NUM_LOCAL_REPLICAS="2.0"), "POPDIST_NUM_LOCAL_REPLICAS='2.0' is not an integer"),
    (_with(REPLICA_INDEX_OFFSET="-2"), "POPDIST_REPLICA_INDEX_OFFSET='-2' must be at least 0"),
    (_with(NUM_IPUS_PER_REPLICA="0"), "POPDIST_NUM_IPUS_PER_REPLICA='0' must be at least 1"),
    (_with(LOCAL_INSTANCE_INDEX=""), "POPDIST_LOCAL_INSTANCE_INDEX='' is not an integer"),
    # inconsistent arithmetic
    (
        _with(REPLICA_INDEX_OFFSET="3"),
        "POPDIST_REPLICA_INDEX_OFFSET=3 must be a multiple of POPDIST_NUM_LOCAL_REPLICAS=2 "
        "below POPDIST_NUM_TOTAL_REPLICAS=8",
    ),
    (_with(REPLICA_INDEX_OFFSET="8"), "POPDIST_REPLICA_INDEX_OFFSET=8 must be a multiple"),
    (
        _with(NUM_LOCAL_REPLICAS="3"),
        "POPDIST_NUM_TOTAL_REPLICAS=8 is not a multiple of POPDIST_NUM_LOCAL_REPLICAS=3",
    ),
    (
        _with(UNIFORM_REPLICAS_PER_INSTANCE="2"),
        "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE='2' must be 1 (every instance holds the same "
        "replicas) or 0 (a non-uniform split); relaunch with poprun",
    ),
    # a non-uniform split: it must follow the rule, and name its instances
    (
        _with(UNIFORM_REPLICAS_PER_INSTANCE="0", NUM_LOCAL_REPLICAS="3"),
        "POPDIST_NUM_LOCAL_REPLICAS=3, POPDIST_REPLICA_INDEX_OFFSET=2 on instance 1: 8 "
        "replicas over 4 instances split as [2, 2, 2, 2] (the first 0 hold one more), which "
        "gives 2 from 2; relaunch with poprun",
    ),
    (
        {**_without(env.INSTANCE_INDEX), env.UNIFORM_REPLICAS_PER_INSTANCE: "0"},
        "POPDIST_INSTANCE_INDEX is not set but POPDIST_UNIFORM_REPLICAS_PER_INSTANCE=0 is",
    ),
    (
        _with(UNIFORM_REPLICAS_PER_INSTANCE="0", INSTANCE_INDEX="4"),
        "POPDIST_INSTANCE_INDEX=4 of POPDIST_NUM_INSTANCES=4 with POPDIST_NUM_TOTAL_REPLICAS=8",
    ),
    (
        _with(NUM_INSTANCES="2"),
        "POPDIST_NUM_INSTANCES='2' disagrees with the replica variables, which give 4",
    ),
    (
        _with(INSTANCE_INDEX="0"),
        "POPDIST_INSTANCE_INDEX='0' disagrees with the replica variables, which give 1",
    ),
    (
        _with(LOCAL_INSTANCE_INDEX="2"),
        "POPDIST_LOCAL_INSTANCE_INDEX=2 must be below POPDIST_NUM_LOCAL_INSTANCES=2",
    ),
    (_with(OFFLINE_MODE="maybe"), "POPDIST_OFFLINE_MODE='maybe' is not a flag"),
    # Open MPI half set or malformed
    (
        {env.OMPI_RANK: "1"},
        "OMPI_COMM_WORLD_SIZE is not set but OMPI_COMM_WORLD_RANK='1' is",
    ),
    ({env.OMPI_SIZE: "2"}, "OMPI_COMM_WORLD_RANK is not set but OMPI_COMM_WORLD_SIZE='2' is"),
    ({env.OMPI_SIZE: "2", env.OMPI_RANK: "2"}, "OMPI_COMM_WORLD_RANK=2 must be below"),
    ({env.OMPI_SIZE: "x", env.OMPI_RANK: "0"}, "OMPI_COMM_WORLD_SIZE='x' is not an integer"),
    (
        {env.OMPI_SIZE: "2", env.OMPI_RANK: "0", env.OMPI_LOCAL_SIZE: "zero"},
        "OMPI_COMM_WORLD_LOCAL_SIZE='zero' is not an integer",
    ),
]


@pytest.mark.parametrize(("environ", "message"), MALFORMED)
def test_malformed_environment_raises_naming_variable_and_value(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(PopdistError) as info:
        read_run(environ)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, RuntimeError)
    assert "\n" not in str(info.value)


def test_records_are_immutable_and_comparable() -> None:
    view = read_run({})
    with pytest.raises(AttributeError, match="immutable"):
        view.num_instances = 2  # type: ignore[misc]
    assert view.replace(num_instances=2).num_instances == 2
    assert view.as_dict()["num_instances"] == 1
    assert next(iter(view.as_dict())) == "num_total_replicas"
    assert hash(view) == hash(RunView())
    assert "num_instances=1" in repr(view)
    assert view != object()


def test_cache_and_offline_read_without_poprun() -> None:
    view = read_run({env.EXECUTABLE_CACHE_PATH: "/tmp/c", env.OFFLINE_MODE: "1"})
    assert (view.executable_cache_path, view.offline_mode, view.from_poprun) == (
        "/tmp/c",
        True,
        False,
    )


@pytest.mark.parametrize(
    ("environ", "source"),
    [
        ({}, env.SingleProcessEnvironment),
        ({env.OFFLINE_MODE: "1"}, env.SingleProcessEnvironment),
        ({env.OMPI_SIZE: "2", env.OMPI_RANK: "1"}, env.MpirunEnvironment),
        ({env.OMPI_RANK: "1"}, env.MpirunEnvironment),  # detected, then a half-set error
        ({**_poprun(), env.OMPI_SIZE: "4", env.OMPI_RANK: "1"}, env.PoprunEnvironment),
        ({env.NUM_INSTANCES: "4"}, env.PoprunEnvironment),
    ],
)
def test_one_detector_per_source_first_match_wins(
    environ: dict[str, str], source: type[env.RunEnvironment]
) -> None:
    assert env.detect(environ) is source
    assert [d.detect(environ) for d in env.DETECTORS].index(True) == env.DETECTORS.index(source)


def test_executor_variables_are_read_here() -> None:
    assert env.read_process("N", "ID", {"N": "3", "ID": "2"}) == (2, 3)
    assert env.read_process("N", "ID", {}) == (0, 1)
    with pytest.raises(PopdistError, match=r"ID='x' is not an integer"):
        env.read_process("N", "ID", {"ID": "x"})
    assert env.read_cache_dir({}) is None
    assert env.read_cache_dir(_poprun(executable_cache_path="/p")) == "/p"
    assert (
        env.read_cache_dir({**_poprun(executable_cache_path="/p"), "POPTORCH_CACHE_DIR": "/t"})
        == "/t"
    )
    assert env.read_compute_threads({}) is None  # alone on the host
    assert env.read_compute_threads({**_poprun(local_count=2), env.OMP_NUM_THREADS: "3"}) is None
    threads = env.read_compute_threads(_poprun(local_count=2))
    assert threads is not None and threads >= 1


def test_popdist_torch_reads_no_environment_variable() -> None:
    """popdist owns every read of the environment: popdist_torch asks popdist."""
    import re

    from tests.support.jobs import ROOT

    pattern = re.compile(r"os\.environ|os\.getenv|getenv\(|OMPI_|POPDIST_")
    readers = [
        (path.relative_to(ROOT), line.strip())
        for path in (ROOT / "popdist_torch").rglob("*.py")
        for line in path.read_text().splitlines()
        if pattern.search(line)
    ]
    assert readers == []


def test_a_non_uniform_split_gives_the_first_instances_one_more_replica() -> None:
    assert env.split_replicas(6, 4) == (2, 2, 1, 1)
    assert env.split_replicas(6, 3) == (2, 2, 2)
    views = []
    for index, (local, offset) in enumerate([(2, 0), (2, 2), (1, 4), (1, 5)]):
        environ = _poprun(
            total=6, index=index, num_local_replicas=local, replica_index_offset=offset
        )
        assert environ[env.UNIFORM_REPLICAS_PER_INSTANCE] == "0"
        views.append(read_run(environ))
    assert [(v.num_local_replicas, v.replica_index_offset) for v in views] == [
        (2, 0),
        (2, 2),
        (1, 4),
        (1, 5),
    ]
    assert {(v.num_instances, v.uniform) for v in views} == {(4, False)}
    assert [v.instance_index for v in views] == [0, 1, 2, 3]
    assert views[3].replica_counts() == (2, 2, 1, 1)
    # given explicitly, a split that divides evenly is still uniform
    even = _poprun(total=8, index=2, num_local_replicas=2, replica_index_offset=4)
    assert even[env.UNIFORM_REPLICAS_PER_INSTANCE] == "1"
    assert read_run(even).replica_counts() == (2, 2, 2, 2)


def test_instance_environment_refuses_a_split_off_the_rule() -> None:
    with pytest.raises(PopdistError, match=r"split as \(2, 2, 1, 1\) give 1 from 4"):
        _poprun(total=6, index=2, num_local_replicas=2, replica_index_offset=4)
    with pytest.raises(PopdistError, match="every instance needs a replica"):
        env.split_replicas(3, 4)


def test_generation_and_deterministic_reduction_readers() -> None:
    assert env.generation({}) == 0
    assert env.generation({env.GENERATION: " 3 "}) == 3
    with pytest.raises(PopdistError, match="POPDIST_GENERATION='x' is not an integer"):
        env.generation({env.GENERATION: "x"})
    with pytest.raises(PopdistError, match="POPDIST_GENERATION='-1' must be at least 0"):
        env.generation({env.GENERATION: "-1"})
    assert env.read_deterministic_reduction({}) is False
    assert env.read_deterministic_reduction({env.DETERMINISTIC_REDUCTION: "1"}) is True
    with pytest.raises(PopdistError, match="POPDIST_DETERMINISTIC_REDUCTION='maybe'"):
        env.read_deterministic_reduction({env.DETERMINISTIC_REDUCTION: "maybe"})


def test_deterministic_mode_pins_the_threads_unless_the_user_chose() -> None:
    alone = _poprun(instances=1, total=2, index=0, local_count=1, local_index=0)
    assert env.read_compute_threads(alone) is None
    assert env.read_compute_threads(alone, deterministic=True) == 1
    chosen = {**alone, env.OMP_NUM_THREADS: "4"}
    assert env.read_compute_threads(chosen, deterministic=True) is None
