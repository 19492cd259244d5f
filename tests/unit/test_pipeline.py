"""Stage splitting and the stage runner: equivalence with a sequential loop, validation."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch
from torch import nn

from popdist_torch.pipeline import (
    BeginBlock,
    Block,
    PipelinedExecution,
    PipelineError,
    ShardedExecution,
    Stage,
    StageRunner,
    check_accumulation,
    chrome_trace,
    has_block_annotations,
    pipeline_ops,
    record_schedule,
    sharded_order,
)

pytestmark = pytest.mark.unit


class ContextNet(nn.Module):
    """Named ``Block`` contexts, a skip connection from B1 into B3, loss in B3."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, 16)
        self.l2 = nn.Linear(16, 16)
        self.l3 = nn.Linear(16, 4)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
        with Block("B1"):
            h1 = torch.relu(self.l1(x))
        with Block("B2"):
            h2 = torch.tanh(self.l2(h1))
        with Block("B3"):
            out = self.l3(h2 + h1)
        if y is None:
            return out
        with Block("B3"):
            loss = self.loss(out, y)
        return out, loss


class IpuContextNet(ContextNet):
    """``Block(ipu_id=...)`` contexts: auto-staged, one stage per device."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
        with Block(ipu_id=0):
            h1 = torch.relu(self.l1(x))
        with Block(ipu_id=1):
            h2 = torch.tanh(self.l2(h1))
            out = self.l3(h2 + h1)
            if y is None:
                return out
            return out, self.loss(out, y)


class BeginNet(nn.Module):
    """``BeginBlock`` annotations on an ordinary sequence of layers."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = BeginBlock(nn.Linear(8, 16), "B1", ipu_id=0)
        self.act = nn.ReLU()
        self.l2 = BeginBlock(nn.Linear(16, 16), "B2", ipu_id=1)
        self.l3 = BeginBlock(nn.Linear(16, 4), "B3", ipu_id=1)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
        out = self.l3(self.act(self.l2(self.act(self.l1(x)))))
        if y is None:
            return out
        return out, self.loss(out, y)


def micro_batches(count: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(5, 8, generator=gen), torch.randint(0, 4, (5,), generator=gen))
        for _ in range(count)
    ]


def sequential_grads(
    model: nn.Module, mbs: list[tuple[torch.Tensor, torch.Tensor]], scale: float
) -> list[Any]:
    outs = []
    for mb in mbs:
        out, loss = model(*mb)
        (scale * loss).backward()
        outs.append((out.detach(), loss.detach()))
    return outs


def assert_same_grads(ref: nn.Module, got: nn.Module) -> None:
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=0, msg=name)


STRATEGIES = {
    "pipelined-1f1b": lambda: PipelinedExecution(
        Stage("B1").ipu(0), Stage("B2").ipu(1), Stage("B3").ipu(2)
    ),
    "pipelined-gpipe": lambda: PipelinedExecution(
        Stage("B1", "B2").ipu(0), Stage("B3").ipu(1), schedule="gpipe"
    ),
    "pipelined-names": lambda: PipelinedExecution("B1", "B2", "B3"),
    "pipelined-auto": lambda: PipelinedExecution(),
    "sharded": lambda: ShardedExecution(Stage("B1").ipu(0), Stage("B2").ipu(1), Stage("B3").ipu(2)),
    "sharded-auto": lambda: ShardedExecution(),
}


@pytest.mark.parametrize("model_cls", [ContextNet, BeginNet])
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_training_matches_sequential_loop(model_cls: type[nn.Module], name: str) -> None:
    torch.manual_seed(0)
    base = model_cls()
    mbs = micro_batches(4)
    ref = copy.deepcopy(base)
    expected = sequential_grads(ref, mbs, 0.25)
    model = copy.deepcopy(base)
    runner = StageRunner(model, STRATEGIES[name](), num_devices=3)
    for _ in range(2):  # a second step accumulates on top, as the loop would
        outs = runner.forward_backward(mbs, grad_scale=0.25)
    sequential_grads(ref, mbs, 0.25)
    assert_same_grads(ref, model)
    for (out, loss), (exp_out, exp_loss) in zip(outs, expected, strict=True):
        torch.testing.assert_close(out, exp_out, rtol=1e-6, atol=0)
        torch.testing.assert_close(loss, exp_loss, rtol=1e-6, atol=0)
        assert not loss.requires_grad


@pytest.mark.parametrize(
    "strategy", [PipelinedExecution(), ShardedExecution()], ids=["pipelined", "sharded"]
)
def test_ipu_id_blocks_auto_stage_onto_their_devices(strategy: Any) -> None:
    torch.manual_seed(0)
    base = IpuContextNet()
    mbs = micro_batches(3)
    ref = copy.deepcopy(base)
    sequential_grads(ref, mbs, 1.0)
    model = copy.deepcopy(base)
    runner = StageRunner(model, strategy, num_devices=2)
    runner.forward_backward(mbs)
    plan = runner.plan(2)
    assert [(s.blocks, s.ipu_id) for s in plan.stages] == [(("ipu0",), 0), (("ipu1",), 1)]
    assert_same_grads(ref, model)


@pytest.mark.parametrize("model_cls", [ContextNet, BeginNet])
@pytest.mark.parametrize("name", ["pipelined-1f1b", "sharded"])
def test_inference_matches_plain_forward(model_cls: type[nn.Module], name: str) -> None:
    torch.manual_seed(0)
    model = model_cls().eval()
    runner = StageRunner(model, STRATEGIES[name](), num_devices=3)
    inputs = [(x,) for x, _ in micro_batches(5)]
    with torch.no_grad():
        outs = runner.forward(inputs)
        for (x,), out in zip(inputs, outs, strict=True):
            torch.testing.assert_close(out, model(x), rtol=1e-6, atol=0)
    assert all(p.grad is None for p in model.parameters())


def test_unannotated_model_runs_as_one_stage() -> None:
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = copy.deepcopy(base)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x).pow(2).mean()

    ref, model = WithLoss(), WithLoss()
    model.load_state_dict(ref.state_dict())
    xs = [(torch.randn(2, 4),) for _ in range(2)]
    for (x,) in xs:
        ref(x).backward()
    runner = StageRunner(model, None, num_devices=1)
    losses = runner.forward_backward(xs)
    assert len(runner.plan(1).stages) == 1
    assert_same_grads(ref, model)
    assert losses[0].shape == ()


def test_torch_thread_count_of_the_caller_is_unchanged() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.ones(64, 64) @ torch.ones(64, 64)  # the caller has used its thread pool
        runner = StageRunner(BeginNet(), PipelinedExecution(), num_devices=2, threads_per_device=1)
        runner.forward_backward(micro_batches(3))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_sharded_runs_one_stage_at_a_time_and_profile_records_every_op() -> None:
    runner = StageRunner(ContextNet(), STRATEGIES["sharded"](), num_devices=3, profile=True)
    runner.forward_backward(micro_batches(3))
    events = sorted(runner.events, key=lambda e: e.start)
    assert len(events) == 3 * 3 * 2
    for earlier, later in itertools.pairwise(events):
        assert earlier.end <= later.start
    assert [(e.stage, e.kind, e.micro_batch) for e in events[:6]] == [
        (0, "F", 0),
        (1, "F", 0),
        (2, "F", 0),
        (2, "B", 0),
        (1, "B", 0),
        (0, "B", 0),
    ]


def test_pipelined_profile_has_each_op_once_per_stage() -> None:
    runner = StageRunner(ContextNet(), STRATEGIES["pipelined-1f1b"](), num_devices=3, profile=True)
    runner.forward_backward(micro_batches(4))
    ops = sorted((e.stage, e.kind, e.micro_batch) for e in runner.events)
    assert ops == sorted((s, k, m) for s in range(3) for k in "FB" for m in range(4))


def test_one_f_one_b_schedule() -> None:
    assert pipeline_ops(2, 3, 4, "1f1b", True) == [
        ("F", 0),
        ("B", 0),
        ("F", 1),
        ("B", 1),
        ("F", 2),
        ("B", 2),
        ("F", 3),
        ("B", 3),
    ]
    assert pipeline_ops(0, 3, 4, "1f1b", True) == [
        ("F", 0),
        ("F", 1),
        ("F", 2),
        ("B", 0),
        ("F", 3),
        ("B", 1),
        ("B", 2),
        ("B", 3),
    ]
    assert pipeline_ops(0, 2, 2, "gpipe", True) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert pipeline_ops(1, 2, 3, "1f1b", False) == [("F", 0), ("F", 1), ("F", 2)]
    assert sharded_order(2, 1, True) == [(0, ("F", 0)), (1, ("F", 0)), (1, ("B", 0)), (0, ("B", 0))]


def test_error_in_a_stage_reaches_the_caller() -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = BeginBlock(nn.Linear(4, 4), "A")
            self.b = BeginBlock(nn.Linear(5, 1), "B")  # wrong width: fails in stage 1

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x)).sum()

    runner = StageRunner(Broken(), PipelinedExecution("A", "B"), num_devices=2)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        runner.forward_backward([(torch.randn(2, 4),)] * 3)


def test_has_block_annotations() -> None:
    assert has_block_annotations(BeginNet())
    assert not has_block_annotations(ContextNet())  # contexts only show when traced


# -- validation ------------------------------------------------------------------------


def test_too_few_accumulation_steps_for_the_pipeline() -> None:
    runner = StageRunner(ContextNet(), STRATEGIES["pipelined-1f1b"](), num_devices=3)
    with pytest.raises(
        PipelineError, match=r"gradient accumulation 2 is too small for 3 pipeline stages.*n >= 3"
    ):
        runner.forward_backward(micro_batches(2))
    with pytest.raises(PipelineError, match="too small for 3"):
        check_accumulation(STRATEGIES["pipelined-1f1b"](), 2)
    check_accumulation(STRATEGIES["sharded"](), 1)  # sharded has no such rule
    StageRunner(ContextNet(), STRATEGIES["sharded"](), num_devices=3).forward_backward(
        micro_batches(1)
    )


def test_unknown_block_name() -> None:
    runner = StageRunner(ContextNet(), PipelinedExecution("B1", "B2", "B9"), num_devices=3)
    with pytest.raises(
        PipelineError,
        match=r"unknown block 'B9' in Stage\('B9'\).ipu\(2\); the model's blocks are 'B1', 'B2', 'B3'",
    ):
        runner.forward_backward(micro_batches(3))


def test_block_on_no_stage() -> None:
    runner = StageRunner(ContextNet(), ShardedExecution("B1", "B2"), num_devices=3)
    with pytest.raises(PipelineError, match=r"block\(s\) 'B3' are on no stage"):
        runner.forward_backward(micro_batches(1))


def test_block_on_two_stages() -> None:
    runner = StageRunner(
        ContextNet(), ShardedExecution(Stage("B1", "B2"), Stage("B2", "B3")), num_devices=3
    )
    with pytest.raises(PipelineError, match="block 'B2' is on stage 0 and on stage 1"):
        runner.forward_backward(micro_batches(1))


def test_stage_on_a_device_the_replica_does_not_have() -> None:
    runner = StageRunner(
        ContextNet(),
        PipelinedExecution(Stage("B1").ipu(0), Stage("B2", "B3").ipu(2)),
        num_devices=2,
    )
    with pytest.raises(
        PipelineError,
        match=r"stage 1 \(B2, B3\) is on ipu 2 but a replica has 2 device\(s\).*--ipus-per-replica",
    ):
        runner.forward_backward(micro_batches(2))


def test_stage_order_that_sends_activations_backwards() -> None:
    runner = StageRunner(ContextNet(), PipelinedExecution("B2", "B1", "B3"), num_devices=3)
    with pytest.raises(
        PipelineError,
        match=r"block 'B1' \(stage 1\) feeds block 'B2' \(stage 0\): activations would go backwards",
    ):
        runner.forward_backward(micro_batches(3))


def test_nested_blocks_are_rejected() -> None:
    class Nested(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with Block("A"), Block("B"):
                return x * 2

    with pytest.raises(PipelineError, match=r"Block\('B'\) opened inside Block\('A'\)"):
        StageRunner(Nested(), ShardedExecution(), num_devices=1).forward([(torch.ones(1),)])


def test_untraceable_forward_runs_staged_at_its_blocks() -> None:
    """Control flow on a tensor value defeats torch.fx: the model is staged as it runs."""

    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with Block("A"):
                if x.sum() > 0:
                    return x
                return -x

    runner = StageRunner(Branchy(), ShardedExecution(), num_devices=1)
    out = runner.forward([(torch.ones(1),), (-torch.ones(1),)])
    assert runner.staged_at_run_time()
    assert [o.item() for o in out] == [1.0, 1.0]


def test_weights_shared_across_stages_are_rejected() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with Block("A"):
                x = x * self.w
            with Block("B"):
                return (x * self.w).sum()

    with pytest.raises(PipelineError, match="used by stage 0 and stage 1"):
        StageRunner(Tied(), ShardedExecution(), num_devices=2).forward_backward([(torch.ones(3),)])


def test_strategy_without_blocks_in_the_model() -> None:
    runner = StageRunner(nn.Linear(2, 1), PipelinedExecution("B1"), num_devices=1)
    with pytest.raises(PipelineError, match="names blocks but the model has none"):
        runner.forward([(torch.ones(1, 2),)])


def test_bad_annotation_arguments() -> None:
    with pytest.raises(PipelineError, match="ipu_id=-1 must be a non-negative integer"):
        Block("A", ipu_id=-1)
    with pytest.raises(PipelineError, match=r"BeginBlock expects an nn\.Module"):
        BeginBlock("layer", "A")  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="needs at least one block name"):
        Stage()
    with pytest.raises(PipelineError, match="takes Stage objects or block names"):
        PipelinedExecution(3)  # type: ignore[arg-type]
    with pytest.raises(PipelineError, match="schedule='zigzag'"):
        PipelinedExecution(schedule="zigzag")  # type: ignore[arg-type]


def test_devices_default_to_what_the_stages_use() -> None:
    runner = StageRunner(ContextNet(), STRATEGIES["pipelined-1f1b"](), num_devices=None)
    runner.forward_backward(micro_batches(3))
    assert runner.devices == [torch.device("cpu")] * 3
    assert runner.threads_per_device == max(1, torch.get_num_threads() // 3)


def test_record_schedule_and_chrome_trace() -> None:
    runner = StageRunner(BeginNet(), PipelinedExecution("B1", "B2", "B3"), num_devices=3)
    runner.forward_backward(micro_batches(3))  # outside: not recorded
    with record_schedule() as events:
        runner.forward_backward(micro_batches(3))
    runner.forward_backward(micro_batches(3))
    assert len(events) == 3 * 3 * 2
    trace = chrome_trace(events)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(events)
    assert min(e["ts"] for e in spans) == 0.0
    assert {(e["pid"], e["tid"]) for e in spans} == {(0, 0), (1, 1), (2, 2)}
    assert {e["name"] for e in spans if e["tid"] == 2} == {"F0", "F1", "F2", "B0", "B1", "B2"}
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names == {"device 0", "device 1", "device 2", "stage 0", "stage 1", "stage 2"}


# -- through the executor -----------------------------------------------------------------


@pytest.mark.parametrize("strategy", [None, "sharded"], ids=["beginblock-auto", "sharded"])
def test_training_model_with_stages_matches_plain_training(strategy: str | None) -> None:
    """trainingModel routes a staged model's step through the runner, outside poprun too."""
    import popdist_torch as poptorch

    class Loss(BeginNet):
        def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Any:
            return super().forward(x, y)

    torch.manual_seed(0)
    base = Loss()
    mbs = micro_batches(3)
    ref = copy.deepcopy(base)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    sequential_grads(ref, mbs, 1 / 3)
    ref_opt.step()

    model = copy.deepcopy(base)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    if strategy == "sharded":
        opts.setExecutionStrategy(ShardedExecution())
    training = poptorch.trainingModel(
        model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
    )
    with record_schedule() as events:
        training(torch.cat([x for x, _ in mbs]), torch.cat([y for _, y in mbs]))
    # PopTorch's AutoStage.SameAsIpu: B2 and B3 share ipu_id 1, so they form one stage.
    assert sorted((e.stage, e.kind, e.micro_batch) for e in events) == sorted(
        (s, k, m) for s in range(2) for k in "FB" for m in range(3)
    )
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=name)

    inf_opts = poptorch.Options().deviceIterations(3)
    if strategy == "sharded":
        inf_opts.setExecutionStrategy(ShardedExecution())
    inference = poptorch.inferenceModel(model.eval(), inf_opts)
    x = torch.cat([x for x, _ in mbs])
    with record_schedule() as events:
        got = inference(x)
    assert {(e.stage, e.kind) for e in events} == {(0, "F"), (1, "F")}
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-6, atol=0)
