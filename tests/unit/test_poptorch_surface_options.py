"""PopART options, the options' read accessors and the precision no-ops, as programs use them.

PopTorch programs ``import popart`` for enumerations, pass engine options through
``opts._Popart.set``, read their options back (``opts.Training.gradient_accumulation``) to
size batches, and set precision options the IPU has and torch does not. Each test would fail
if one of those stopped the program or changed what it learns.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import popdist
import popdist.poptorch
import popdist_torch as poptorch
from popdist_torch import popart
from popdist_torch.options import UnsupportedOptionError
from tests.support.instance_env import as_instance

pytestmark = pytest.mark.unit


# -- the popart stand-in -------------------------------------------------------------------


def test_popart_is_importable_as_programs_import_it() -> None:
    import popdist_torch.popart as by_path

    assert by_path is popart is poptorch.popart
    assert popart.versionString() == popart.__version__


def test_popart_enumerations_have_popart_values() -> None:
    """The integers programs pass to ``_Popart.set`` (PopTorch documents two of them)."""
    assert int(popart.RecomputationType.Pipeline) == 3
    assert int(popart.SyntheticDataMode.RandomNormal) == 2
    assert int(popart.RecomputationType.NoRecompute) == 0
    assert int(popart.MergeVarUpdateType.AutoTight) == 3
    assert int(popart.VirtualGraphMode.ExecutionPhases) == 3
    assert int(popart.AccumulateOuterFragmentSchedule.OverlapMemoryOptimized) == 3
    assert int(popart.SubgraphCopyingStrategy.JustInTime) == 1
    assert int(popart.ReductionType.NoReduction) == 2
    assert int(popart.DataType.FLOAT16) == 12
    assert (
        popart.BatchSerializationTransformContext.Forward
        is popart.BatchSerializationTransformContext.Fwd
    )


def test_popart_settings_objects_keep_what_they_are_given() -> None:
    location = popart.TensorLocation(
        popart.TensorStorage.OffChip, popart.ReplicatedTensorSharding.On
    )
    assert location.replicatedTensorSharding == popart.ReplicatedTensorSharding.On
    settings = popart.TensorLocationSettings(popart.TensorStorage.OffChip, 4)
    assert settings.location.storage == popart.TensorStorage.OffChip
    assert settings.minElementsForOffChip == 4
    patterns = popart.Patterns(popart.PatternsLevel.Minimal).enablePattern("PadSum", True)
    assert patterns.isPatternEnabled("PadSum") and not patterns.isPatternEnabled("OpToIdentity")
    session = popart.SessionOptions()
    assert session.enableOutlining is True
    session.enableOutlining = False
    session.autoRecomputation = popart.RecomputationType.Standard
    assert session.toDict() == {
        "enableOutlining": False,
        "autoRecomputation": popart.RecomputationType.Standard,
    }
    with pytest.raises(AttributeError, match="enableOutlinning"):
        session.enableOutlinning = False
    logger = popart.getLogger()
    logger.setLevel("DEBUG")
    assert popart.getLogger().level == "DEBUG"


# -- opts._Popart --------------------------------------------------------------------------


def test_popart_set_records_known_keys_silently() -> None:
    opts = poptorch.Options()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert opts._Popart.set("autoRecomputation", int(popart.RecomputationType.Pipeline)) is (
            opts._Popart
        )
        opts._Popart.set("accumulateOuterFragmentSettings.schedule", 3)
        opts._Popart.set("disableGradAccumulationTensorStreams", True)
        opts._Popart.setEngineOptions({"opt.internalExchangeOptimisationTarget": "balanced"})
        opts._Popart.setPatterns({"TiedGather": True}, 0)
    assert opts._Popart.options == {
        "autoRecomputation": 3,
        "accumulateOuterFragmentSettings.schedule": 3,
        "disableGradAccumulationTensorStreams": True,
        "engineOptions": {"opt.internalExchangeOptimisationTarget": "balanced"},
        "patterns": {"TiedGather": True},
        "patterns_level": 0,
    }
    assert opts.toDict()["_Popart"] == opts._Popart.options
    assert opts.clone()._Popart.options == opts._Popart.options


def test_popart_set_warns_once_for_an_unknown_key() -> None:
    opts = poptorch.Options()
    with pytest.warns(UserWarning, match="'autoRecompute' is not a PopART session option") as w:
        opts._Popart.set("autoRecompute", 3)
    assert w[0].filename == __file__  # it points at the program's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        poptorch.Options()._Popart.set("autoRecompute", 2)  # once per key
    assert opts._Popart.options == {"autoRecompute": 3}
    with pytest.warns(UserWarning, match="'notAStructure.member'"):
        opts._Popart.set("notAStructure.member", 1)


# -- reading options back ------------------------------------------------------------------


def test_values_read_back_as_poptorch_names_them() -> None:
    opts = poptorch.Options().deviceIterations(4).replicationFactor(2).randomSeed(7)
    opts.Training.gradientAccumulation(8)
    opts.Training.setMeanAccumulationAndReplicationReductionStrategy(
        poptorch.MeanReductionStrategy.Running
    )
    opts.logDir("logs").modelName("net").connectionType(poptorch.ConnectionType.OnDemand)
    assert (opts.device_iterations, opts.replication_factor, opts.random_seed) == (4, 2, 7)
    assert opts.Training.gradient_accumulation == 8
    assert opts.Training.meanAccumulationAndReplicationReductionStrategy == (
        poptorch.MeanReductionStrategy.Running
    )
    assert (opts.log_dir, opts.model_name, opts.connection_type) == ("logs", "net", 1)
    assert opts("device_iterations") == 4 and opts.Training("gradient_accumulation") == 8
    assert opts.Distributed.num_distributed_processes == 1
    assert opts.Distributed.distributed_process_id == 0
    assert not hasattr(opts, "ipu_id")  # PopTorch has it only once useIpuId was called
    assert opts.useIpuId(1).ipu_id == 1
    with pytest.raises(AttributeError, match="devce_iterations"):
        _ = opts.devce_iterations


def test_tensor_locations_read_back_with_poptorch_keys() -> None:
    opts = poptorch.Options()
    offchip = poptorch.TensorLocationSettings().useOnChipStorage(False).minElementsForOffChip(4)
    opts.TensorLocations.setWeightLocation(offchip).setOptimizerLocation(offchip)
    assert opts.TensorLocations.location_weight == {"onChip": 0, "minElementsForOffChip": 4}
    assert opts.TensorLocations.location_optimizer["onChip"] == 0
    assert opts.TensorLocations.optimizer_on_chip is False
    assert not hasattr(opts.TensorLocations, "location_activation")  # until it is set


def test_assignment_is_the_setter() -> None:
    opts = poptorch.Options()
    opts.replication_factor = 4
    opts.device_iterations = 2
    opts.Training.gradient_accumulation = 3
    opts.Training.accumulation_and_replication_reduction_type = poptorch.ReductionType.Sum
    assert opts.toDict()["replication_factor"] == 4
    assert (opts.device_iterations, opts.Training.gradient_accumulation) == (2, 3)
    assert opts.Training.accumulation_and_replication_reduction_type == poptorch.ReductionType.Sum
    with pytest.raises(poptorch.OptionsError, match="replicationFactor"):
        opts.replication_factor = 0


def _poprun_env(monkeypatch: pytest.MonkeyPatch, *, instances: int, index: int) -> None:
    as_instance(monkeypatch, replicas=2 * instances, instances=instances, index=index)


def test_under_poprun_the_values_are_the_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    _poprun_env(monkeypatch, instances=4, index=2)
    opts = poptorch.Options()
    assert opts.Distributed.num_distributed_processes == popdist.getNumInstances() == 4
    assert opts.Distributed.distributed_process_id == popdist.getInstanceIndex() == 2
    launched = popdist.poptorch.Options()
    assert launched.replication_factor == popdist.getNumLocalReplicas() == 2
    assert launched.Distributed.num_distributed_processes == 4
    global_batch = (
        launched.device_iterations
        * launched.replication_factor
        * launched.Training.gradient_accumulation
        * launched.Distributed.num_distributed_processes
    )
    assert global_batch == 8
    with pytest.raises(UnsupportedOptionError, match="replicationFactor"):
        launched.replication_factor = 1


# -- precision options: accepted, recorded, training unchanged -----------------------------


def _train(opts: poptorch.Options, model: nn.Module) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.net(x)
            return out, nn.functional.cross_entropy(out, y)

    wrapped = WithLoss()
    training = poptorch.trainingModel(
        wrapped, opts, optimizer=torch.optim.SGD(wrapped.parameters(), lr=0.1)
    )
    for _ in range(3):
        training(x, y)
    return [p.detach().clone() for p in model.parameters()]


def test_precision_and_loss_scaling_options_leave_training_unchanged() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    twin, start = copy.deepcopy(net), net[0].weight.detach().clone()
    opts = poptorch.Options().deviceIterations(2)
    opts.Precision.setPartialsType(torch.float16)
    opts.Precision.enableStochasticRounding(True)
    opts.Precision.enableFloatingPointExceptions(True)
    opts.Training.setAutomaticLossScaling(True)
    opts._Popart.set("enableStochasticRounding", True)
    assert opts.Precision.toDict()["setPartialsType"] == "torch.float16"
    assert opts.Precision.toDict()["enableStochasticRounding"] is True
    assert opts.Training.automatic_loss_scaling is True
    got = _train(opts, net)
    want = _train(poptorch.Options().deviceIterations(2), twin)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    assert not torch.equal(got[0], start)  # it learned


# -- a PopTorch program as people write them, only the imports changed ----------------------


class _Classifier(nn.Module):
    """A classifier marked up as PopTorch applications do, computing its own loss."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(4, 16)
        self.head = nn.Linear(16, 2)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with poptorch.NameScope("encoder"):
            h = poptorch.set_available_memory(torch.relu(self.hidden(x)), 0.4)
        h = poptorch.recomputationCheckpoint(h)
        torch.ops.poptorch.push_name_scope("head")
        out = self.head(h)
        torch.ops.poptorch.pop_name_scope()
        return out, self.loss(out, y)


def test_a_poptorch_program_with_popart_options_learns() -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 4, generator=gen)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    dataset = torch.utils.data.TensorDataset(x, y)

    opts = poptorch.Options()
    opts.deviceIterations(2)
    opts.replicationFactor(2)
    opts.Training.gradientAccumulation(2)
    opts.randomSeed(0)
    opts.setAvailableMemoryProportion({"IPU0": 0.3})
    opts.Precision.setPartialsType(torch.float16)
    opts.Precision.enableStochasticRounding(True)
    opts.Training.setAutomaticLossScaling(True)
    opts.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useOnChipStorage(False)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every key below is a PopART session option
        opts._Popart.set("disableGradAccumulationTensorStreams", True)
        opts._Popart.set("subgraphCopyingStrategy", int(popart.SubgraphCopyingStrategy.JustInTime))
        opts._Popart.set(
            "accumulateOuterFragmentSettings.schedule",
            int(popart.AccumulateOuterFragmentSchedule.OverlapMemoryOptimized),
        )
        opts._Popart.set("autoRecomputation", int(popart.RecomputationType.Pipeline))
    micro_batch = 4
    global_batch = (
        micro_batch
        * opts.device_iterations
        * opts.replication_factor
        * opts.Training.gradient_accumulation
        * opts.Distributed.num_distributed_processes
    )
    assert global_batch == 32
    loader = poptorch.DataLoader(opts, dataset, batch_size=micro_batch, shuffle=True)
    model = _Classifier()
    training = poptorch.trainingModel(
        model, opts, optimizer=poptorch.optim.SGD(model.parameters(), lr=0.3)
    )
    for _ in range(4):
        for xs, ys in loader:
            assert xs.shape[0] == global_batch
            training(xs, ys)
    with torch.no_grad():
        accuracy = (model(x, y)[0].argmax(1) == y).float().mean().item()
    assert accuracy > 0.9, accuracy
