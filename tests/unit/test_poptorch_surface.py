"""``import popdist_torch as poptorch``: PopTorch's whole public surface, and auto-staging."""

from __future__ import annotations

import copy
import logging
import re
import warnings
from inspect import signature
from typing import Any

import pytest
import torch
from torch import nn

import popdist_torch as poptorch
from popdist_torch import popart
from popdist_torch.options import NO_OP_OPTIONS, UnsupportedOptionError
from popdist_torch.pipeline import PipelineError, record_schedule
from popdist_torch.surface import NAMES, NO_OP, OPTION_OWNERS, REFUSED, SUPPORTED, Row, rows_of
from popdist_torch.surface.page import PAGE, render
from tests.support.jobs import ROOT

pytestmark = pytest.mark.unit

#: PopTorch 3's public API as its sources and reference documentation define it
#: (``poptorch/__init__.py``, ``ops.py``, ``options.py``, ``enums.py``), by owner: the
#: surface table must list every one (it may list more, such as PopTorch 2's names).
POPTORCH_3: dict[str, str] = {
    "poptorch": """
        trainingModel inferenceModel PoplarExecutor DataLoader AsynchronousDataAccessor Options
        TensorLocationSettings identity_loss optim load isRunningOnIpu ipuHardwareIsAvailable
        ipuHardwareVersion setLogLevel registerPreCompileHook registerPostCompileHook
        ICustomArgParser registerCustomArgParser accessAttributes getIpuTensorId
        importPoptorchMetadataFromFile Error RecoverableError UnrecoverableError profiling
        Block BeginBlock BlockFunction removeBlocks Stage Phase AutoStage PipelinedExecution
        ShardedExecution SerialPhasedExecution ParallelPhasedExecution PhasedExecution
        ctc_beam_search_decoder ipu_print_tensor for_loop cond nop dynamic_slice dynamic_update
        recomputationCheckpoint serializedMatMul set_available_memory set_overlap_for_input
        set_overlap_for_output custom_op CPU MultiConv NameScope Attribute fps nearest
        AnchorMode OutputMode ReductionType MeanReductionStrategy DataLoaderMode SharingStrategy
        ConnectionType SyncPattern HalfFloatCastingBehavior MatMulSerializationMode Liveness
        OverlapMode MultiConvPlanType CommGroupType VariableRetrievalMode""",
    "Options": """
        anchorMode anchorTensor appendToLocationExcludes autoRoundNumIPUs broadcastBuffers
        clone connectionType defaultAnchorMode defaultOutputMode deviceIterations
        disableModuleNamescope enableExecutableCaching enableProfiling enableStableNorm
        enableSyntheticData exists from_json inputReplicaGrouping loadFromFile logCycleCount
        logDir maxRepeatLogs modelName outputMode randomSeed relaxOptimizerAttributesChecks
        replicationFactor setAvailableMemoryProportion setExecutionStrategy
        showCompilationProgressBar sourceLocationExcludes syncPattern toDict
        updatableNamedBuffers useIpuId useIpuModel useOfflineIpuTarget""",
    "Options.Training": """
        accumulationAndReplicationReductionType gradientAccumulation setAutomaticLossScaling
        setConvolutionDithering setMeanAccumulationAndReplicationReductionStrategy""",
    "Options.Distributed": "configureProcessId disable numProcesses processId setEnvVarNames",
    "Options.TensorLocations": """
        numIOTiles setAccumulatorLocation setActivationLocation setOptimizerLocation
        setWeightLocation""",
    "Options.Jit": "traceModel",
    "Options.Precision": """
        enableFloatingPointExceptions enableStochasticRounding halfFloatCasting
        runningStatisticsAlwaysFloat setPartialsType""",
    "Options._Popart": "set setEngineOptions setPatterns",
    "TensorLocationSettings": """
        minElementsForOffChip minElementsForReplicatedTensorSharding useIOTilesToLoad
        useIOTilesToStore useOnChipStorage useReplicatedTensorSharding""",
    "PoplarExecutor": """
        attachToDevice compilationTime compile compileAndExport copyNamedBuffersToDevice
        copyWeightsToDevice copyWeightsToHost copyWeightsToHostIfNeeded cycleCount destroy
        detachFromDevice getAnchoredTensor getComputeLatency getHostIpuLatency getIpuHostLatency
        getLatency getPerfCounters getTensorNames isAttachedToDevice isCompiled loadExecutable
        load_state_dict model options rng_state save setOptimizer""",
}

# Every Options method of the table with arguments a PopTorch script passes, and what
# happens: "set" or "property" (supported), "no-op" (recorded, listed in NO_OP_OPTIONS),
# "refused". The table's status must agree.
_LOC = poptorch.TensorLocationSettings().useOnChipStorage(False)
OPTION_CALLS: dict[str, tuple[tuple[Any, ...], str]] = {
    "anchorMode": ((poptorch.OutputMode.All,), "set"),
    "anchorTensor": (("grad", "x"), "set"),
    "appendToLocationExcludes": (("torch/nn",), "no-op"),
    "autoRoundNumIPUs": ((True,), "no-op"),
    "broadcastBuffers": ((False,), "set"),
    "clone": ((), "set"),
    "connectionType": ((poptorch.ConnectionType.OnDemand,), "no-op"),
    "defaultAnchorMode": ((), "set"),
    "defaultOutputMode": ((), "set"),
    "deviceIterations": ((4,), "set"),
    "disableModuleNamescope": ((), "no-op"),
    "enableExecutableCaching": ((None,), "set"),
    "enableProfiling": (("profile",), "refused"),
    "enableStableNorm": ((True,), "no-op"),
    "enableSyntheticData": ((True,), "set"),
    "exists": (("random_seed",), "set"),
    "from_json": (("{}",), "refused"),
    "inputReplicaGrouping": ((2,), "refused"),
    "loadFromFile": (("opts.conf",), "refused"),
    "logCycleCount": ((True,), "no-op"),
    "logDir": (("logs",), "no-op"),
    "maxRepeatLogs": ((8,), "no-op"),
    "modelName": (("net",), "no-op"),
    "outputMode": ((poptorch.OutputMode.Sum,), "set"),
    "randomSeed": ((42,), "set"),
    "relaxOptimizerAttributesChecks": ((), "no-op"),
    "replicationFactor": ((2,), "set"),
    "setAvailableMemoryProportion": (({"IPU0": 0.5},), "no-op"),
    "setExecutionStrategy": ((poptorch.ShardedExecution(),), "set"),
    "showCompilationProgressBar": ((False,), "no-op"),
    "sourceLocationExcludes": ((["torch"],), "no-op"),
    "syncPattern": ((poptorch.SyncPattern.SinglePipeline,), "no-op"),
    "toDict": ((), "set"),
    "updatableNamedBuffers": ((["bn.running_mean"],), "no-op"),
    "useIpuId": ((1,), "no-op"),
    "useIpuModel": ((True,), "no-op"),
    "useOfflineIpuTarget": ((2,), "no-op"),
    "Training.accumulationAndReplicationReductionType": ((poptorch.ReductionType.Sum,), "set"),
    "Training.gradientAccumulation": ((4,), "set"),
    "Training.deterministicReduction": ((True,), "set"),
    "Training.cudaGraphs": ((False,), "set"),
    "Training.setAutomaticLossScaling": ((True,), "no-op"),
    "Training.setConvolutionDithering": ((True,), "no-op"),
    "Training.setMeanAccumulationAndReplicationReductionStrategy": (
        (poptorch.MeanReductionStrategy.Running,),
        "no-op",
    ),
    "Distributed.configureProcessId": ((0, 1), "set"),
    "Distributed.disable": ((), "set"),
    "Distributed.numProcesses": ((), "property"),
    "Distributed.processId": ((), "property"),
    "Distributed.setEnvVarNames": (("NO_SUCH_SIZE", "NO_SUCH_RANK"), "set"),
    "TensorLocations.numIOTiles": ((32,), "no-op"),
    "TensorLocations.setAccumulatorLocation": ((_LOC,), "no-op"),
    "TensorLocations.setActivationLocation": ((_LOC,), "no-op"),
    "TensorLocations.setOptimizerLocation": ((_LOC,), "set"),
    "TensorLocations.setWeightLocation": ((_LOC,), "no-op"),
    "Jit.traceModel": ((True,), "no-op"),
    "Precision.enableFloatingPointExceptions": ((True,), "no-op"),
    "Precision.enableStochasticRounding": ((True,), "no-op"),
    "Precision.halfFloatCasting": ((poptorch.HalfFloatCastingBehavior.Default,), "no-op"),
    "Precision.runningStatisticsAlwaysFloat": ((True,), "no-op"),
    "Precision.setPartialsType": ((torch.float16,), "no-op"),
    "Precision.autocastEnabled": ((True,), "set"),
    "_Popart.set": (("enableOutlining", False), "no-op"),
    "_Popart.setEngineOptions": (({"opt.x": "1"},), "no-op"),
    "_Popart.setPatterns": (({"PadSum": True},), "no-op"),
    "_Popart.options": ((), "read"),
    # PopTorch's read accessors: value names that read back as attributes
    **{
        name: ((), "read")
        for name in (
            "device_iterations",
            "replication_factor",
            "random_seed",
            "output_mode",
            "output_return_period",
            "broadcast_buffers",
            "input_group_size",
            "log_dir",
            "max_repeat_logs",
            "auto_round_num_ipus",
            "connection_type",
            "sync_pattern",
            "available_memory_proportion",
            "Training.gradient_accumulation",
            "Training.accumulation_and_replication_reduction_type",
            "Training.meanAccumulationAndReplicationReductionStrategy",
            "Training.deterministic_reduction",
            "Training.cuda_graphs",
            "Distributed.num_distributed_processes",
            "Distributed.distributed_process_id",
        )
    },
}


_STATUS = {
    "set": SUPPORTED,
    "property": SUPPORTED,
    "read": SUPPORTED,
    "no-op": NO_OP,
    "refused": REFUSED,
}


def _option_rows() -> dict[str, Row]:
    return {row.path: row for row in NAMES if row.owner in OPTION_OWNERS}


def _poptorch_3(owner: str) -> set[str]:
    return set(POPTORCH_3[owner].split())


def test_the_table_lists_every_poptorch_name_once() -> None:
    qualified = [row.qualified for row in NAMES]
    assert len(qualified) == len(set(qualified))
    missing = [
        f"{owner}.{name}"
        for owner in POPTORCH_3
        for name in sorted(_poptorch_3(owner) - {row.name for row in rows_of(owner)})
    ]
    assert missing == []


def test_every_poptorch_name_is_reachable_and_typos_are_not() -> None:
    names = [row.name for row in rows_of("poptorch")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # AnchorMode warns on access
        missing = [name for name in names if not hasattr(poptorch, name)]
    assert missing == []
    assert set(names) <= set(dir(poptorch))
    assert not hasattr(poptorch, "PipelinedExecutoin")
    with pytest.raises(AttributeError, match="PipelinedExecutoin"):
        _ = poptorch.PipelinedExecutoin  # type: ignore[attr-defined]


def test_the_tutorial_names_are_the_pipeline_classes() -> None:
    from popdist_torch import pipeline

    for name in ("Block", "BeginBlock", "Stage", "PipelinedExecution", "ShardedExecution"):
        assert getattr(poptorch, name) is getattr(pipeline, name)


def _target(opts: Any, path: str) -> tuple[Any, str]:
    group, _, method = path.rpartition(".")
    return (getattr(opts, group) if group else opts), method


@pytest.mark.parametrize("name", sorted(_option_rows()))
def test_every_options_method_behaves_as_documented(name: str) -> None:
    args, outcome = OPTION_CALLS[name]
    assert _option_rows()[name].status == _STATUS[outcome]
    opts = poptorch.Options()
    target, method = _target(opts, name)
    if outcome == "property":
        assert isinstance(getattr(target, method), int)
        return
    if outcome == "read":
        values = target.toDict()
        assert getattr(target, method) == values.get(method, values) == target(method)
        return
    call = getattr(target, method)
    if outcome == "refused":
        with pytest.raises(UnsupportedOptionError, match=re.escape(method)):
            call(*args)
        return
    before = target.toDict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        result = call(*args)
    if outcome == "no-op":
        assert name in NO_OP_OPTIONS
        assert result is target
        assert target.toDict() != before, "a no-op setter records its value for toDict()"
    else:
        assert name not in NO_OP_OPTIONS


def test_option_calls_cover_the_table_exactly() -> None:
    assert sorted(OPTION_CALLS) == sorted(_option_rows())


def test_generated_setters_follow_their_rows() -> None:
    """No-op setters chain and name their reason; refusals raise the row's message."""
    opts = poptorch.Options()
    for path, row in _option_rows().items():
        target, method = _target(opts, path)
        if row.status == NO_OP:
            assert row.note in getattr(type(target), method).__doc__, path
        elif row.status == REFUSED and row.when is None:
            with pytest.raises(UnsupportedOptionError) as caught:
                getattr(target, method)("x")
            assert str(caught.value) == row.message()


def test_tensor_location_settings_methods_chain() -> None:
    settings = poptorch.TensorLocationSettings()
    for row in rows_of("TensorLocationSettings"):
        arg: Any = 4 if row.name.startswith("minElements") else False
        assert getattr(settings, row.name)(arg) is settings


def test_replicated_tensor_sharding_is_accepted_and_recorded() -> None:
    """Applications' configurations set it for the optimizer state (tests/unit/test_sharded_state.py)."""
    sharded = poptorch.TensorLocationSettings().useReplicatedTensorSharding(True)
    assert sharded.toDict()["useReplicatedTensorSharding"] == 1
    opts = poptorch.Options()
    opts.TensorLocations.setOptimizerLocation(sharded)
    assert (
        opts.toDict()["TensorLocations"]["location_optimizer"]["useReplicatedTensorSharding"] == 1
    )
    assert opts.TensorLocations.optimizer_on_chip and opts.TensorLocations.optimizer_sharded


def test_the_page_is_the_tables_rendering() -> None:
    """``docs/poptorch-names.md`` is rendered from the table: re-render it after a change."""
    assert (ROOT / PAGE).read_text() == render(), (
        "docs/poptorch-names.md differs from the table: run `python -m popdist_torch.surface.page`"
    )
    rows = set(re.findall(r"^\| `([^`]+)`", (ROOT / PAGE).read_text(), re.M))
    assert rows == {row.qualified for row in NAMES}


def test_every_row_resolves() -> None:
    """Each name of the table is an attribute of its owner (module, options, executor)."""
    opts = poptorch.Options()
    owners: dict[str, Any] = {
        "poptorch": poptorch,
        "TensorLocationSettings": poptorch.TensorLocationSettings(),
        "PoplarExecutor": poptorch.inferenceModel(nn.Linear(2, 2)),
        **{owner: _target(opts, f"{owner.partition('.')[2]}.x")[0] for owner in OPTION_OWNERS},
        "torch.ops.poptorch": torch.ops.poptorch,
        "popart": popart,
        "poptorch._impl": getattr(poptorch, "_impl"),  # noqa: B009  (PopTorch's private module)
        "poptorch.optim": poptorch.optim,
        "poptorch.optim.Optimizer": poptorch.optim.SGD(nn.Linear(2, 2).parameters()),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        missing = [
            row.qualified
            for row in NAMES
            if row.owner != "optim" and not hasattr(owners[row.owner], row.name)
        ]
    assert missing == []
    optimizers = (poptorch.optim.SGD, poptorch.optim.Adam, poptorch.optim.AdamW)
    arguments = {
        name
        for cls in (*optimizers, poptorch.optim.RMSprop, poptorch.optim.LAMB)
        for name in signature(cls).parameters
    }
    assert sorted({row.name for row in rows_of("optim")} - arguments) == []


def test_refused_optimizer_arguments_raise_their_rows_reason() -> None:
    params = nn.Linear(2, 2).parameters
    for row in rows_of("optim"):
        if row.status != REFUSED:
            continue
        cls = poptorch.optim.RMSprop if row.name == "use_tf_variant" else poptorch.optim.SGD
        if row.name.endswith("momentum_accum_type"):
            cls = poptorch.optim.Adam
        value = True if row.name == "use_tf_variant" else torch.float16
        with pytest.raises(ValueError) as caught:
            cls(params(), lr=0.1, **{row.name: value})
        assert str(caught.value) == f"{row.name}={value!r} is not supported: {row.note}"


def test_anchor_mode_is_a_deprecated_alias_of_output_mode() -> None:
    with pytest.warns(FutureWarning, match="OutputMode"):
        anchor = poptorch.AnchorMode  # type: ignore[attr-defined]
    assert "AnchorMode" in dir(poptorch)
    opts = poptorch.Options()
    with pytest.warns(FutureWarning, match="outputMode") as caught:
        assert opts.anchorMode(anchor.EveryN, 5) is opts
    assert len(caught) == 1
    assert (opts.output_mode, opts.output_return_period) == (poptorch.OutputMode.EveryN, 5)
    with pytest.warns(FutureWarning, match="OutputMode"):
        opts.outputMode(anchor.All)
    assert opts.output_mode == poptorch.OutputMode.All
    with pytest.warns(FutureWarning, match="defaultOutputMode"):
        assert opts.defaultAnchorMode() is False


def test_refused_names_raise_naming_what_to_use() -> None:
    with pytest.raises(UnsupportedOptionError, match="load_checkpoint"):
        poptorch.load("model.poptorch")
    with pytest.raises(UnsupportedOptionError, match="in torch inside forward"):
        poptorch.custom_op([torch.ones(1)], "Cube", "com.acme", 1)
    with pytest.raises(UnsupportedOptionError, match="ipuHardwareIsAvailable"):
        poptorch.ipuHardwareVersion()
    for row in rows_of("poptorch"):
        if row.status == REFUSED:
            with pytest.raises(UnsupportedOptionError) as caught:
                getattr(poptorch, row.name)()
            assert str(caught.value) == row.message()


def test_hardware_queries_and_log_level() -> None:
    assert poptorch.ipuHardwareIsAvailable() is False
    assert poptorch.ipuHardwareIsAvailable(4) is False
    assert poptorch.isRunningOnIpu() is False
    logger = logging.getLogger("popdist_torch")
    before = logger.level
    try:
        poptorch.setLogLevel("DEBUG")
        assert logger.level == logging.DEBUG
        poptorch.setLogLevel(4)
        assert logger.level == logging.ERROR
        with pytest.raises(ValueError, match="TRACE, DEBUG, INFO, WARN, ERR, OFF"):
            poptorch.setLogLevel("LOUD")
    finally:
        logger.setLevel(before)


def test_ops_compute_what_poptorch_computes() -> None:
    x = torch.arange(10.0)
    assert poptorch.nop(x) is x
    assert poptorch.recomputationCheckpoint(x) is x
    assert poptorch.set_available_memory(x, 0.2) is x
    (out,) = poptorch.for_loop(3, lambda t: t * 2, [torch.ones(2)])
    torch.testing.assert_close(out, torch.full((2,), 8.0))
    (picked,) = poptorch.cond(torch.tensor(False), lambda t: t + 1, [x], lambda t: t - 1, [x])
    torch.testing.assert_close(picked, x - 1)
    torch.testing.assert_close(poptorch.dynamic_slice(x, 0, torch.tensor(2), 6, 2), x[2:8:2])
    updated = poptorch.dynamic_update(x, torch.zeros(3), 0, torch.tensor(4), 3)
    assert updated[4:7].sum() == 0 and x[4] == 4  # a copy, the input is unchanged
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(
        poptorch.serializedMatMul(a, b, poptorch.MatMulSerializationMode.OutputChannels, 2), a @ b
    )
    assert poptorch.CPU(lambda t: t * 3, "triple")(x)[1] == 3
    with (
        poptorch.NameScope("enc"),
        poptorch.MultiConv().planType(poptorch.MultiConvPlanType.Serial),
    ):
        assert torch.equal(torch.relu(x), x)


def test_executor_methods_exist_and_refusals_name_the_alternative() -> None:
    model = nn.Linear(2, 2)
    executor = poptorch.inferenceModel(model)
    missing = [row.name for row in rows_of("PoplarExecutor") if not hasattr(executor, row.name)]
    assert missing == []
    assert executor.copyWeightsToHostIfNeeded() is False
    with pytest.raises(UnsupportedOptionError, match="save_checkpoint"):
        executor.compileAndExport("model.poptorch")
    with pytest.raises(UnsupportedOptionError, match=r"torch\.profiler"):
        executor.getHostIpuLatency()
    for row in rows_of("PoplarExecutor"):
        if row.status == REFUSED:
            with pytest.raises(UnsupportedOptionError) as caught:
                getattr(executor, row.name)("x")
            assert str(caught.value) == row.message()
    state = executor.rng_state
    first = torch.rand(3)
    executor.rng_state = state
    torch.testing.assert_close(torch.rand(3), first)


def test_asynchronous_data_accessor_yields_the_loaders_batches() -> None:
    data = [torch.full((2,), float(i)) for i in range(5)]
    accessor = poptorch.AsynchronousDataAccessor(data, buffer_size=2)
    assert len(accessor) == 5
    assert [int(t[0]) for t in accessor] == [0, 1, 2, 3, 4]
    accessor.terminate()


def test_profiling_channel_is_a_no_op() -> None:
    obj = object()
    channel = poptorch.profiling.Channel("data")
    assert channel.instrument(obj, "__getitem__") is obj
    with channel.tracepoint("load"):
        pass


# -- auto-staging --------------------------------------------------------------------------


class PlacedNet(nn.Module):
    """Blocks with ``ipu_id`` and no strategy: PopTorch pipelines them (SameAsIpu)."""

    def __init__(self, placed: bool = True) -> None:
        super().__init__()
        self.placed = placed
        self.l1 = nn.Linear(6, 12)
        self.l2 = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
        with poptorch.Block(ipu_id=0 if self.placed else None):
            h = torch.relu(self.l1(x))
        with poptorch.Block(ipu_id=1 if self.placed else None):
            out = self.l2(h)
        if y is None:
            return out
        return out, nn.functional.cross_entropy(out, y)


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)


def _reference_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ga: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xs, ys in zip(x.chunk(ga), y.chunk(ga), strict=True):
        (model(xs, ys)[1] / ga).backward()
    opt.step()


@pytest.mark.parametrize("annotate", ["block", "block_function"])
def test_placed_blocks_without_strategy_are_pipelined(annotate: str) -> None:
    torch.manual_seed(0)
    if annotate == "block":
        base: nn.Module = PlacedNet()
    else:

        class FunctionNet(PlacedNet):
            @poptorch.BlockFunction("first", ipu_id=0)
            def first(self, x: torch.Tensor) -> torch.Tensor:
                return torch.relu(self.l1(x))

            @poptorch.BlockFunction("second", ipu_id=1)
            def second(self, h: torch.Tensor) -> torch.Tensor:
                return self.l2(h)

            def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
                out = self.second(self.first(x))
                return out if y is None else (out, nn.functional.cross_entropy(out, y))

        base = FunctionNet()
    ref, model = copy.deepcopy(base), copy.deepcopy(base)
    x, y = _data()
    _reference_step(ref, x, y, ga=4)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # placed blocks: no warning
        with record_schedule() as events:
            training(x, y)
    assert {(e.stage, e.kind) for e in events} == {(0, "F"), (0, "B"), (1, "F"), (1, "B")}
    for p, q in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)


def test_placed_blocks_pipeline_inference_too() -> None:
    model = PlacedNet().eval()
    x, _ = _data()
    inference = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    with record_schedule() as events:
        got = inference(x)
    assert {e.stage for e in events} == {0, 1}
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))


def test_unplaced_blocks_without_strategy_run_whole_and_warn_once() -> None:
    torch.manual_seed(0)
    base = PlacedNet(placed=False)
    ref, model = copy.deepcopy(base), copy.deepcopy(base)
    x, y = _data()
    _reference_step(ref, x, y, ga=2)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(2)
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    with (
        pytest.warns(UserWarning, match=r"ipu_id .*setExecutionStrategy") as caught,
        record_schedule() as events,
    ):
        training(x, y)
    assert len(caught) == 1 and "\n" not in str(caught[0].message)
    assert events == []  # not staged
    for p, q in zip(ref.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        training(x, y)  # warned once, on the first call


class ReturningNet(nn.Module):
    """Blocks on ipu 0, 1, then 0 again."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with poptorch.Block("A", ipu_id=0):
            x = self.a(x)
        with poptorch.Block("B", ipu_id=1):
            x = self.b(x)
        with poptorch.Block("C", ipu_id=0):
            return self.c(x)


def test_auto_increment_gives_each_block_its_stage() -> None:
    model = ReturningNet().eval()
    x = torch.randn(4, 4)
    opts = poptorch.Options().deviceIterations(2)
    opts.setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))
    with record_schedule() as events:
        got = poptorch.inferenceModel(model, opts)(x)
    assert {e.stage for e in events} == {0, 1, 2}
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))
    same_as_ipu = poptorch.Options().deviceIterations(2)
    same_as_ipu.setExecutionStrategy(poptorch.PipelinedExecution())
    with pytest.raises(PipelineError, match=r"AutoStage\.AutoIncrement"):
        poptorch.inferenceModel(model, same_as_ipu)(x)


def test_phased_execution_runs_as_the_sharded_schedule() -> None:
    model = ReturningNet().eval()
    x = torch.randn(4, 4)
    strategy = poptorch.SerialPhasedExecution(
        poptorch.Phase("A"), poptorch.Phase(poptorch.Stage("B")), ["C"]
    )
    strategy.phase(1).ipus(0)
    assert strategy.setTensorsLiveness(poptorch.Liveness.OffChipAfterFwd) is strategy
    opts = poptorch.Options().setExecutionStrategy(strategy)
    with record_schedule() as events:
        got = poptorch.inferenceModel(model, opts)(x)
    assert [e.stage for e in events] == [0, 1, 2]
    with torch.no_grad():
        torch.testing.assert_close(got, model(x))
    assert poptorch.PhasedExecution is poptorch.SerialPhasedExecution
    with pytest.raises(PipelineError, match="needs its phases"):
        poptorch.ParallelPhasedExecution()


def test_remove_blocks_unmarks_begin_block_modules() -> None:
    net = nn.Sequential(poptorch.BeginBlock(nn.Linear(2, 2), "A", ipu_id=0), nn.ReLU())
    from popdist_torch.pipeline import has_block_annotations

    assert has_block_annotations(net)
    assert poptorch.removeBlocks(net) is net
    assert not has_block_annotations(net)
