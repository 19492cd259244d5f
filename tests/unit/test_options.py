"""popdist_torch.Options and popdist.poptorch.Options: defaults, setters, errors, freezing."""

from __future__ import annotations

import pytest

import popdist.poptorch
import popdist_torch as poptorch
from popdist import env
from popdist_torch.options import NO_OP_OPTIONS
from tests.support.instance_env import as_instance

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*env.ALL, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "POPTORCH_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_enum_values_are_poptorchs() -> None:
    assert [int(m) for m in poptorch.OutputMode] == [0, 1, 2, 3, 4]
    assert [m.name for m in poptorch.OutputMode] == ["Final", "EveryN", "All", "Sum", "Default"]
    assert (poptorch.ReductionType.Sum, poptorch.ReductionType.Mean) == (0, 1)
    assert poptorch.ReductionType.NoReduction == 2
    assert [int(m) for m in poptorch.DataLoaderMode] == [0, 1, 2]


def test_defaults() -> None:
    opts = poptorch.Options()
    assert opts.device_iterations == 1
    assert opts.replication_factor == 1
    assert opts.random_seed is None
    assert opts.output_mode == poptorch.OutputMode.Default
    assert opts.output_return_period == 1
    assert opts.broadcast_buffers is True
    assert opts.executable_cache_dir is None
    assert opts.execution_strategy is None
    assert opts.Training.gradient_accumulation == 1
    assert opts.Training.accumulation_and_replication_reduction_type == poptorch.ReductionType.Mean
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (0, 1)
    assert opts.TensorLocations.optimizer_on_chip is True


def test_setters_chain_and_read_back() -> None:
    opts = poptorch.Options().deviceIterations(3).replicationFactor(4).randomSeed(7)
    opts.outputMode(poptorch.OutputMode.EveryN, output_return_period=2).broadcastBuffers(False)
    opts.Training.gradientAccumulation(2).accumulationAndReplicationReductionType(
        poptorch.ReductionType.Sum
    )
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False)
    )
    assert (opts.device_iterations, opts.replication_factor, opts.random_seed) == (3, 4, 7)
    assert (opts.output_mode, opts.output_return_period) == (poptorch.OutputMode.EveryN, 2)
    assert opts.broadcast_buffers is False
    assert opts.Training.gradient_accumulation == 2
    assert opts.Training.accumulation_and_replication_reduction_type == poptorch.ReductionType.Sum
    assert opts.TensorLocations.optimizer_on_chip is False
    d = opts.toDict()
    assert d["device_iterations"] == 3
    assert d["Training"]["gradient_accumulation"] == 2
    assert d["TensorLocations"]["optimizer_on_chip"] is False


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda o: o.deviceIterations(0), r"deviceIterations\(0\)"),
        (lambda o: o.replicationFactor(-1), r"replicationFactor\(-1\)"),
        (lambda o: o.Training.gradientAccumulation(1.5), r"gradientAccumulation\(1.5\)"),
        (lambda o: o.outputMode(poptorch.OutputMode.EveryN), r"output_return_period"),
        (lambda o: o.outputMode(9), r"expected an OutputMode"),
        (
            lambda o: o.Training.accumulationAndReplicationReductionType(
                poptorch.ReductionType.NoReduction
            ),
            r"expected ReductionType.Mean or ReductionType.Sum",
        ),
        (lambda o: o.Distributed.configureProcessId(2, 2), r"below the number of processes"),
        (lambda o: o.setExecutionStrategy("pipelined"), r"PipelinedExecution"),
    ],
)
def test_bad_values_raise_value_error(call: object, match: str) -> None:
    with pytest.raises(poptorch.OptionsError, match=match):
        call(poptorch.Options())  # type: ignore[operator]


def test_unsupported_options_raise() -> None:
    opts = poptorch.Options()
    with pytest.raises(poptorch.UnsupportedOptionError, match="inputReplicaGrouping"):
        opts.inputReplicaGrouping(2)
    with pytest.raises(AttributeError):
        opts.notAnOption(1)  # type: ignore[attr-defined]


def test_no_ops_are_recorded_and_listed() -> None:
    opts = poptorch.Options().showCompilationProgressBar(False).logDir("/tmp/x")
    opts.Jit.traceModel(False)
    assert opts.toDict()["showCompilationProgressBar"] is False
    assert opts.toDict()["Jit"] == {"traceModel": False}
    for name in NO_OP_OPTIONS:
        obj: object = opts
        for part in name.split("."):
            obj = getattr(obj, part)
        assert callable(obj), name


def test_distributed_defaults_read_ompi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    opts = poptorch.Options()
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (3, 4)
    opts.Distributed.disable()
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (0, 1)
    monkeypatch.setenv("MY_N", "2")
    monkeypatch.setenv("MY_ID", "1")
    opts.Distributed.setEnvVarNames("MY_N", "MY_ID")
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (1, 2)
    monkeypatch.setenv("MY_ID", "x")
    with pytest.raises(poptorch.OptionsError, match="MY_ID='x'"):
        opts.Distributed.setEnvVarNames("MY_N", "MY_ID")


def test_cache_dir_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.EXECUTABLE_CACHE_PATH, "/from/poprun")
    for name, value in env.instance_environment(
        num_total_replicas=2,
        num_ipus_per_replica=1,
        num_instances=2,
        instance_index=1,
        local_instance_index=1,
        num_local_instances=2,
        host="localhost",
    ).items():
        monkeypatch.setenv(name, value)
    assert poptorch.Options().executable_cache_dir == "/from/poprun"
    monkeypatch.setenv("POPTORCH_CACHE_DIR", "/from/poptorch")
    assert poptorch.Options().executable_cache_dir == "/from/poptorch"
    assert poptorch.Options().enableExecutableCaching(None).executable_cache_dir is None


def test_freeze_and_clone() -> None:
    opts = poptorch.Options().deviceIterations(2)
    opts._freeze()
    with pytest.raises(poptorch.FrozenOptionsError, match="cannot call deviceIterations"):
        opts.deviceIterations(3)
    with pytest.raises(poptorch.FrozenOptionsError, match=r"Training.gradientAccumulation"):
        opts.Training.gradientAccumulation(3)
    copy = opts.clone()
    copy.deviceIterations(5).Training.gradientAccumulation(4)
    assert (copy.device_iterations, opts.device_iterations) == (5, 2)
    assert opts.Training.gradient_accumulation == 1


def test_clone_shares_execution_strategy() -> None:
    from popdist_torch.pipeline import ShardedExecution

    strategy = ShardedExecution("B1")
    opts = poptorch.Options().setExecutionStrategy(strategy)
    assert opts.clone().execution_strategy is strategy


def _poprun_env(
    monkeypatch: pytest.MonkeyPatch, *, replicas: int, instances: int, index: int
) -> None:
    as_instance(
        monkeypatch, replicas=replicas, instances=instances, index=index, ipus_per_replica=2
    )


def test_popdist_options_follow_poprun(monkeypatch: pytest.MonkeyPatch) -> None:
    _poprun_env(monkeypatch, replicas=8, instances=4, index=3)
    opts = popdist.poptorch.Options()
    assert opts.replication_factor == 2
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (3, 4)
    assert opts.ipus_per_replica == 2
    assert popdist.poptorch.Options(ipus_per_replica=1).ipus_per_replica == 1
    assert popdist.poptorch.Options(4).ipus_per_replica == 4
    assert opts.toDict()["replication_factor"] == 2
    clone = opts.clone()
    assert isinstance(clone, popdist.poptorch.Options)
    with pytest.raises(RuntimeError, match="Cannot call `replicationFactor`"):
        clone.replicationFactor(1)


def test_popdist_options_outside_poprun() -> None:
    opts = popdist.poptorch.Options()
    assert opts.replication_factor == 1
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (0, 1)
    opts._freeze()
    assert opts.toDict()["Distributed"]["num_distributed_processes"] == 1


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("useIpuId", lambda o: o.useIpuId(1)),
        ("replicationFactor", lambda o: o.replicationFactor(1)),
        ("Distributed.disable", lambda o: o.Distributed.disable()),
        ("Distributed.setEnvVarNames", lambda o: o.Distributed.setEnvVarNames("A", "B")),
        ("Distributed.configureProcessId", lambda o: o.Distributed.configureProcessId(0, 1)),
    ],
)
def test_popdist_options_blocked_setters(name: str, call: object) -> None:
    opts = popdist.poptorch.Options(ipus_per_replica=1)
    with pytest.raises(RuntimeError) as info:
        call(opts)  # type: ignore[operator]
    assert str(info.value) == f"Cannot call `{name}` with popdist.poptorch.Options"


def test_popdist_options_are_the_executors_public_class(monkeypatch: pytest.MonkeyPatch) -> None:
    assert popdist.poptorch.Options is poptorch.PopdistOptions
    assert poptorch.Options().ipus_per_replica is None  # as many devices as the stages name
    _poprun_env(monkeypatch, replicas=4, instances=2, index=1)
    opts = popdist.poptorch.Options()
    assert type(opts.Distributed) is not type(poptorch.Options().Distributed)
    assert isinstance(opts.Distributed, poptorch.options.DistributedOptions)
    assert opts.toDict()["ipus_per_replica"] == 2
    with pytest.raises(poptorch.OptionsError, match=r"ipus_per_replica=0\): expected an integer"):
        popdist.poptorch.Options(ipus_per_replica=0)


def test_distributed_default_reads_poprun_through_popdist(monkeypatch: pytest.MonkeyPatch) -> None:
    _poprun_env(monkeypatch, replicas=6, instances=3, index=2)
    opts = poptorch.Options()
    assert (opts.Distributed.processId, opts.Distributed.numProcesses) == (2, 3)
    monkeypatch.delenv(env.NUM_LOCAL_REPLICAS)
    with pytest.raises(popdist.PopdistError, match="POPDIST_NUM_LOCAL_REPLICAS is not set"):
        poptorch.Options()


def test_setters_come_from_the_surface_table() -> None:
    """A group gets its rows' no-op and refused setters; one also written by hand is an error."""
    from popdist_torch.options.group import OptionGroup, install_setters

    @install_setters
    class Jit(OptionGroup):
        _owner = "Options.Jit"

    assert Jit().traceModel(True).toDict() == {"traceModel": True}

    class Contradiction(OptionGroup):
        _owner = "Options.Jit"

        def traceModel(self, trace_model: bool) -> Contradiction:
            return self

    with pytest.raises(TypeError, match="traceModel is written by hand"):
        install_setters(Contradiction)
