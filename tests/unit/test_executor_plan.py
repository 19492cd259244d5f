"""The executor's set-up as one pure plan, driven with fake worlds (no GPU, no process).

:func:`resolve` takes the options, the model's facts and the world (devices, instances,
the backend's reach, graph capture) and decides the device, the runner, the reduction,
the staging and whether the micro-step may be captured. The pipeline's stage placement and
the idle-GPU line are pure too.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popdist_torch as poptorch
from popdist import env
from popdist_torch.errors import ExecutorError
from popdist_torch.execution.capture.eligibility import StepFacts, plan_refusal, step_refusal
from popdist_torch.execution.setup import (
    ModelFacts,
    World,
    announce_idle_gpus,
    idle_gpus_note,
    model_facts,
    resolve,
)
from popdist_torch.execution.setup import gpus as gpus_module
from popdist_torch.pipeline import BeginBlock, PipelinedExecution, Stage, stage_devices

pytestmark = pytest.mark.unit

CPU, CUDA0 = torch.device("cpu"), torch.device("cuda", 0)
UNSTAGED, STAGED = ModelFacts(staged=False), ModelFacts(staged=True)


def opts(replicas: int = 4) -> poptorch.Options:
    return poptorch.Options().replicationFactor(replicas)


def gpu(visible: int = 1, **kwargs: object) -> World:
    return World(device=CUDA0, visible_gpus=visible, captures=True, **kwargs)  # type: ignore[arg-type]


def test_one_cpu_instance_runs_its_replicas_locally_with_no_reducer() -> None:
    plan = resolve(opts(), UNSTAGED, World(device=CPU), training=True)
    assert (plan.device, plan.runner, plan.reducer, plan.shards) == (CPU, "local", False, False)
    assert plan.mean_over is None and plan.watch_blocks and not plan.outputs_to_host
    assert plan.capture_refusal == "the device has no graph capture (CUDA graphs)"
    assert not plan.captures


def test_a_gpu_instance_computes_there_and_may_capture_its_fused_step() -> None:
    plan = resolve(opts(), UNSTAGED, gpu(), training=True)
    assert plan.device == CUDA0 and plan.outputs_to_host and plan.stage_gpus == 0
    assert plan.capture_refusal is None and plan.captures


def test_several_instances_reduce_with_hooks_and_average_an_even_split() -> None:
    world = World(device=CPU, communicates=True, replica_counts=(2, 2))
    plan = resolve(opts(2), UNSTAGED, world, training=True)
    assert plan.reducer and plan.average and plan.mean_over is None
    uneven = resolve(
        opts(2),
        UNSTAGED,
        World(device=CPU, communicates=True, replica_counts=(2, 1)),
        training=True,
    )
    assert uneven.reducer and not uneven.average and uneven.mean_over == 3
    summed = opts(2)
    summed.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Sum)
    assert not resolve(summed, UNSTAGED, world, training=True).average
    assert not resolve(opts(2), UNSTAGED, world, training=False).reducer  # inference


def test_the_optimizer_state_is_sharded_only_across_instances() -> None:
    sharded = opts(2)
    sharded.TensorLocations.setOptimizerLocation(
        poptorch.TensorLocationSettings().useReplicatedTensorSharding(True)
    )
    alone = resolve(sharded, UNSTAGED, World(device=CPU), training=True)
    together = resolve(
        sharded,
        UNSTAGED,
        World(device=CPU, communicates=True, replica_counts=(2, 2)),
        training=True,
    )
    assert (alone.shards, together.shards) == (False, True)


def test_the_deterministic_reduction_has_its_own_runner_and_refuses_stages() -> None:
    o = opts(2)
    o.Training.deterministicReduction()
    plan = resolve(o, UNSTAGED, gpu(communicates=True, replica_counts=(2, 1)), training=True)
    assert plan.runner == "deterministic" and not plan.reducer and plan.mean_over == 3
    assert plan.capture_refusal == "the deterministic reduction runs the replicas one by one"
    with pytest.raises(ExecutorError, match="a model split into stages cannot use it"):
        resolve(o, STAGED, World(device=CPU), training=True)


@pytest.mark.parametrize(
    ("world", "expected"),
    [
        (World(device=CPU), (CPU, 0)),  # no GPU: CPU workers
        (gpu(visible=2), (CUDA0, 2)),  # the stages go on the instance's GPUs
        (World(device=CPU, visible_gpus=2), (CPU, 0)),  # offline, or Horovod across instances
    ],
)
def test_stages_go_on_the_gpus_the_unstaged_model_would_use(
    world: World, expected: tuple[torch.device, int]
) -> None:
    plan = resolve(opts(1), STAGED, world, training=True)
    assert (plan.device, plan.stage_gpus) == expected
    assert plan.runner == "staged" and not plan.watch_blocks
    assert plan.outputs_to_host == (expected[1] > 0)
    assert plan.capture_refusal is not None


@pytest.mark.parametrize(
    ("devices", "gpus", "expected"),
    [
        (2, 2, ["cuda:0", "cuda:1"]),  # a replica's stages, one GPU each
        (4, 2, ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]),  # fewer GPUs: shared round-robin
        (3, 1, ["cuda:0"] * 3),  # one GPU: every stage on cuda:0
        (2, 8, ["cuda:0", "cuda:1"]),  # more GPUs than stages: the first ones
        (2, 0, ["cpu", "cpu"]),  # no GPU: CPU workers
    ],
)
def test_stage_placement(devices: int, gpus: int, expected: list[str]) -> None:
    assert [str(d) for d in stage_devices(devices, gpus)] == expected


def test_the_stage_runner_places_its_devices_on_the_gpus_it_is_given() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = BeginBlock(nn.Linear(2, 2), "A", ipu_id=0)
            self.b = BeginBlock(nn.Linear(2, 2), "B", ipu_id=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x)).sum()

    runner = poptorch.pipeline.StageRunner(Two(), None, num_devices=2, gpus=0)
    assert runner.devices == [CPU, CPU]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"training": False}, "an inference model"),
        ({"replicas": 1}, "one local replica"),
        ({"device_captures": False}, "no graph capture"),
        ({"enabled": False}, "turned off"),
        ({"runner": "staged"}, "pipeline stages"),
        ({"runner": "deterministic"}, "deterministic reduction"),
        ({"reducer": True}, "several instances"),
        ({"output_anchors": True}, "Output___ anchor"),
        ({"autocast": True}, "autocast"),
        ({}, None),
    ],
)
def test_plan_refusal_names_each_excluded_case(
    kwargs: dict[str, object], reason: str | None
) -> None:
    args: dict[str, object] = {
        "training": True,
        "replicas": 2,
        "device_captures": True,
        "enabled": True,
        "runner": "local",
        "reducer": False,
        "output_anchors": False,
        "autocast": False,
    }
    got = plan_refusal(**{**args, **kwargs})  # type: ignore[arg-type]
    assert got is None if reason is None else (got is not None and reason in got)


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        (
            StepFacts(in_turn="BatchNorm updates its running statistics"),
            "one after the other (BatchNorm",
        ),
        (StepFacts(random_ops=("aten.bernoulli",)), "random numbers (aten.bernoulli)"),
        (StepFacts(data_dependent_ops=("aten._local_scalar_dense",)), "from the data"),
        (StepFacts(saved_tensor_hooks=True), "activation checkpointing"),
        (StepFacts(hooks=("forward hook on fc",)), "hooks run in the step (forward hook on fc)"),
        (StepFacts(tensor_arguments=True), "0-dim tensor argument"),
        (StepFacts(), None),
    ],
)
def test_step_refusal_names_each_excluded_case(facts: StepFacts, reason: str | None) -> None:
    got = step_refusal(facts)
    assert got is None if reason is None else (got is not None and reason in got)


def test_the_opt_out_is_an_option_and_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env.CUDA_GRAPHS, raising=False)
    assert env.read_cuda_graphs() and poptorch.Options().Training.cuda_graphs
    assert env.CUDA_GRAPHS in env.USER_TUNING  # poprun passes the user's setting on
    monkeypatch.setenv(env.CUDA_GRAPHS, "0")
    assert not poptorch.Options().Training.cuda_graphs
    assert poptorch.Options().Training.cudaGraphs(True).cuda_graphs  # the option wins
    plan = resolve(opts(), UNSTAGED, gpu(), training=True)
    assert plan.capture_refusal is not None and "turned off" in plan.capture_refusal
    monkeypatch.setenv(env.CUDA_GRAPHS, "perhaps")
    with pytest.raises(poptorch.OptionsError, match="POPDIST_CUDA_GRAPHS='perhaps' is not a flag"):
        poptorch.Options().Training.cuda_graphs  # noqa: B018
    with pytest.raises(poptorch.OptionsError, match=r"cudaGraphs\(1\): expected True or False"):
        poptorch.Options().Training.cudaGraphs(1)  # type: ignore[arg-type]


def test_model_facts_read_stages_and_output_anchors() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    assert model_facts(model, poptorch.Options()) == ModelFacts(staged=False)
    staged = poptorch.Options().setExecutionStrategy(PipelinedExecution(Stage("B")))
    assert model_facts(model, staged).staged
    anchored = poptorch.Options().anchorTensor("out", "Output___0")
    assert model_facts(model, anchored) == ModelFacts(staged=False, output_anchors=True)
    gradient = poptorch.Options().anchorTensor("g", "Gradient___0.weight")
    assert not model_facts(model, gradient).output_anchors


# -- GPUs left idle ---------------------------------------------------------------------------


def test_eight_replicas_on_one_of_eight_gpus_say_so_with_the_launch_that_uses_them() -> None:
    note = idle_gpus_note(visible=8, used=1, local_replicas=8, instances=1, devices_per_replica=1)
    assert note == (
        "popdist_torch: this instance computes on 1 of the 8 GPUs it sees (its 8 local "
        "replicas share cuda:0; 7 idle); to use every GPU run one instance per GPU: poprun "
        "--num-instances 8 --num-replicas 8"
    )


def test_staged_replicas_name_their_gpus_per_replica() -> None:
    note = idle_gpus_note(visible=4, used=2, local_replicas=2, instances=1, devices_per_replica=2)
    assert note is not None
    assert (
        "computes on 2 of the 4 GPUs it sees (its 2 local replicas share cuda:0-1; 2 idle)" in note
    )
    assert note.endswith(
        "one instance per replica, 2 GPUs each: poprun --num-instances 2 --num-replicas 2 "
        "--ipus-per-replica 2"
    )


def test_one_replica_on_eight_gpus_is_told_the_launch_of_eight() -> None:
    """replicationFactor(1) on an 8-GPU machine: --num-replicas 1 would still use one GPU."""
    note = idle_gpus_note(visible=8, used=1, local_replicas=1, instances=1, devices_per_replica=1)
    assert note is not None and note.endswith("poprun --num-instances 8 --num-replicas 8")
    assert "(cuda:0; 7 idle)" in note
    two = idle_gpus_note(visible=4, used=1, local_replicas=2, instances=2, devices_per_replica=1)
    assert two is not None and two.endswith("--num-instances 8 --num-replicas 8")  # 4 GPUs each


@pytest.mark.parametrize(("visible", "used"), [(1, 1), (4, 4), (0, 0), (4, 0)])
def test_no_note_when_every_gpu_or_none_is_used(visible: int, used: int) -> None:
    assert (
        idle_gpus_note(
            visible=visible, used=used, local_replicas=4, instances=1, devices_per_replica=1
        )
        is None
    )


def test_the_note_is_printed_once_per_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gpus_module, "_ANNOUNCED", set())
    world = gpu(visible=4, replica_counts=(4,))
    plan = resolve(opts(4), UNSTAGED, world, training=True)
    for _ in range(2):  # a training and an inference model of one module
        announce_idle_gpus(plan, world, opts(4))
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "computes on 1 of the 4 GPUs" in lines[0]
    announce_idle_gpus(resolve(opts(1), UNSTAGED, gpu(1), training=True), gpu(1), opts(1))
    assert capsys.readouterr().err == ""  # one GPU, used
