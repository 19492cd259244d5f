"""The PopDist getters, backend entry points and execute_on_instances within one process."""

from __future__ import annotations

import sys

import pytest

import popdist
from popdist import collectives, env
from popdist.env import PopdistError, instance_environment

pytestmark = pytest.mark.unit

GETTERS = (
    "isPopdistEnvSet",
    "getNumTotalReplicas",
    "getNumLocalReplicas",
    "getNumIpusPerReplica",
    "getReplicaIndexOffset",
    "getInstanceIndex",
    "getNumInstances",
    "getLocalInstanceIndex",
    "getDeviceId",
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*env.ALL, env.OMPI_SIZE, env.OMPI_RANK, env.OMPI_LOCAL_RANK, env.OMPI_LOCAL_SIZE):
        monkeypatch.delenv(name, raising=False)


def _launch(
    monkeypatch: pytest.MonkeyPatch, *, total: int, instances: int, index: int, ipr: int = 1
) -> None:
    for name, value in instance_environment(
        num_total_replicas=total,
        num_ipus_per_replica=ipr,
        num_instances=instances,
        instance_index=index,
        local_instance_index=index % 2,
        num_local_instances=2,
        host="localhost",
    ).items():
        monkeypatch.setenv(name, value)


def _answers() -> dict[str, object]:
    return {name: getattr(popdist, name)() for name in GETTERS}


def test_defaults_outside_poprun() -> None:
    assert _answers() == {
        "isPopdistEnvSet": False,
        "getNumTotalReplicas": 1,
        "getNumLocalReplicas": 1,
        "getNumIpusPerReplica": 1,
        "getReplicaIndexOffset": 0,
        "getInstanceIndex": 0,
        "getNumInstances": 1,
        "getLocalInstanceIndex": 0,
        "getDeviceId": 0,
    }
    assert popdist.checkNumIpusPerReplica(1)
    assert popdist.checkNumIpusPerReplica(4)  # nothing to contradict outside poprun
    assert not popdist.checkNumIpusPerReplica(0)


@pytest.mark.parametrize("index", range(4))
def test_getters_under_poprun_4_instances_8_replicas(
    monkeypatch: pytest.MonkeyPatch, index: int
) -> None:
    _launch(monkeypatch, total=8, instances=4, index=index, ipr=2)
    answers = _answers()
    assert answers == {
        "isPopdistEnvSet": True,
        "getNumTotalReplicas": 8,
        "getNumLocalReplicas": 2,
        "getNumIpusPerReplica": 2,
        "getReplicaIndexOffset": 2 * index,
        "getInstanceIndex": index,
        "getNumInstances": 4,
        "getLocalInstanceIndex": index % 2,
        # 4-device groups on a 16-device system: after 16 singles and 8 pairs (the ids
        # Graphcore's tutorial printed: 24..27)
        "getDeviceId": 24 + index,
    }
    assert popdist.checkNumIpusPerReplica(2)
    assert not popdist.checkNumIpusPerReplica(1)


def test_device_id_numbering() -> None:
    # Not under poprun: one instance, one replica; ids for a group of k devices.
    assert popdist.getDeviceId(1) == 0
    assert popdist.getDeviceId(2) == 2  # 2 singles, then the pair
    assert popdist.getDeviceId(4) == 4 + 2  # 4 singles, 2 pairs, then the quad
    assert popdist.getDeviceId(3) == popdist.getDeviceId(4)  # rounded to a power of two


def test_device_id_distinct_per_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = set()
    for index in range(4):
        _launch(monkeypatch, total=4, instances=4, index=index)
        ids.add(popdist.getDeviceId())
    assert ids == {0, 1, 2, 3}  # one device per instance: the singles
    for index in range(4):
        _launch(monkeypatch, total=16, instances=4, index=index, ipr=2)
        ids.add(popdist.getDeviceId())  # 8-device groups of a 32-device system
    assert ids == {0, 1, 2, 3, 56, 57, 58, 59}


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: popdist.getDeviceId(-1), "ipusPerReplica=-1"),
        (lambda: popdist.getDeviceId("2"), "ipusPerReplica='2'"),
        (lambda: popdist.checkNumIpusPerReplica(2.0), "numIpusPerReplica=2.0"),
    ],
)
def test_bad_getter_arguments(call: object, needle: str) -> None:
    with pytest.raises(PopdistError, match=needle):
        call()  # type: ignore[operator]


def test_ompi_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.OMPI_SIZE, "3")
    monkeypatch.setenv(env.OMPI_RANK, "1")
    monkeypatch.setenv(env.OMPI_LOCAL_RANK, "1")
    assert _answers() == {
        "isPopdistEnvSet": False,
        "getNumTotalReplicas": 3,
        "getNumLocalReplicas": 1,
        "getNumIpusPerReplica": 1,
        "getReplicaIndexOffset": 1,
        "getInstanceIndex": 1,
        "getNumInstances": 3,
        "getLocalInstanceIndex": 1,
        "getDeviceId": 1,  # one device per instance: the single devices, by instance
    }


@pytest.mark.parametrize("getter", [*GETTERS, "checkNumIpusPerReplica"])
def test_every_getter_raises_on_a_half_set_environment(
    monkeypatch: pytest.MonkeyPatch, getter: str
) -> None:
    _launch(monkeypatch, total=8, instances=4, index=1)
    monkeypatch.delenv(env.NUM_LOCAL_REPLICAS)
    args = (1,) if getter == "checkNumIpusPerReplica" else ()
    with pytest.raises(PopdistError, match=r"^POPDIST_NUM_LOCAL_REPLICAS is not set but "):
        getattr(popdist, getter)(*args)


def test_getters_raise_on_a_malformed_value(monkeypatch: pytest.MonkeyPatch) -> None:
    _launch(monkeypatch, total=8, instances=4, index=1)
    monkeypatch.setenv(env.REPLICA_INDEX_OFFSET, "two")
    with pytest.raises(PopdistError, match=r"POPDIST_REPLICA_INDEX_OFFSET='two' is not an integer"):
        popdist.getInstanceIndex()


def test_getters_follow_the_environment_as_it_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert popdist.getNumInstances() == 1
    _launch(monkeypatch, total=6, instances=3, index=2)
    assert (popdist.getNumInstances(), popdist.getInstanceIndex()) == (3, 2)


# --- backend --------------------------------------------------------------------------------


def test_missing_horovod_names_the_setup_script_and_the_torch_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "horovod.torch", None)  # makes the import fail
    with pytest.raises(PopdistError) as info:
        popdist.init(backend="horovod")
    message = str(info.value)
    assert "horovod.torch" in message
    assert "scripts/setup.sh" in message and "--backend torch" in message
    assert not popdist.isBackendInitialized()


def test_init_checks_the_environment_before_horovod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    monkeypatch.setenv(env.NUM_TOTAL_REPLICAS, "4")
    with pytest.raises(PopdistError, match="half set"):
        popdist.init()


def test_finalize_without_init_is_a_no_op() -> None:
    assert not popdist.isBackendInitialized()
    popdist.finalizeBackend()
    assert not popdist.isBackendInitialized()
    assert popdist.initializeBackend is popdist.init
    assert collectives.init is popdist.init
    assert popdist.finalizeBackend is collectives.finalize
    assert popdist.isBackendInitialized is collectives.is_initialized


# --- execute_on_instances, one process -----------------------------------------------------------


def test_execute_on_instances_single_process_calls_fn() -> None:
    calls: list[tuple[object, ...]] = []

    def fn(a: int, *, b: int) -> int:
        calls.append((a, b))
        return a + b

    assert popdist.execute_on_instances({0}, fn, 1, b=2) == 3
    assert calls == [(1, 2)]


@pytest.mark.parametrize(
    ("instances", "needle"),
    [
        ({1}, r"instances=\[1\]: 1 is not an instance index in \[0, 1\)"),
        ({-1, 0}, r"-1 is not an instance index"),
        ({"0"}, r"'0' is not an instance index"),
        (0, r"instances=0: expected a set of instance indices"),
        (set(), r"instances=set\(\): name at least one instance"),
    ],
)
def test_execute_on_instances_validates_indices(instances: object, needle: str) -> None:
    ran: list[int] = []
    with pytest.raises(PopdistError, match=needle):
        popdist.execute_on_instances(instances, ran.append, 1)  # type: ignore[arg-type]
    assert ran == []


def test_execute_on_instances_validates_against_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    _launch(monkeypatch, total=8, instances=4, index=1)
    with pytest.raises(PopdistError, match=r"4 is not an instance index in \[0, 4\)"):
        popdist.execute_on_instances({0, 4}, print)


def test_execute_on_instances_propagates_fn_errors_single_process() -> None:
    def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        popdist.execute_on_instances([0], boom)


# --- import hygiene --------------------------------------------------------------------------


def test_public_names() -> None:
    for name in popdist.__all__:
        assert hasattr(popdist, name), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = popdist.nope  # type: ignore[attr-defined]
