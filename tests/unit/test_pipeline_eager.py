"""Staging without a trace: models torch.fx cannot trace, keyword inputs, dict outputs, ties.

Every model here is checked against plain torch running the same micro-batches in a loop
(``(scale * loss).backward()`` per micro-batch), on the traced path where torch.fx can
trace the model and on the eager path (``staging="eager"``, or forced by the model).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import popdist_torch as poptorch
from popdist_torch.pipeline import (
    AutoStage,
    BeginBlock,
    Block,
    MicroBatch,
    PipelinedExecution,
    PipelineError,
    SerialPhasedExecution,
    ShardedExecution,
    Stage,
    StageRunner,
    record_schedule,
)

pytestmark = pytest.mark.unit


class Net(nn.Module):
    """Three BeginBlock layers; keyword inputs; returns a dict, a tuple or the loss alone."""

    def __init__(self, returns: str = "tuple-last") -> None:
        super().__init__()
        self.l1 = BeginBlock(nn.Linear(8, 16), "B1", ipu_id=0)
        self.l2 = BeginBlock(nn.Linear(16, 16), "B2", ipu_id=1)
        self.l3 = BeginBlock(nn.Linear(16, 4), "B3", ipu_id=2)
        self.returns = returns

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        out = self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))
        if labels is None:
            return out
        loss = nn.functional.cross_entropy(out, labels)
        if self.returns == "dict":
            return {"logits": out, "loss": loss}
        if self.returns == "tuple-first":
            return loss, out
        return out, loss


def batches(count: int, seed: int = 1) -> list[MicroBatch]:
    gen = torch.Generator().manual_seed(seed)
    return [
        MicroBatch(
            (),
            {
                "x": torch.randn(5, 8, generator=gen),
                "labels": torch.randint(0, 4, (5,), generator=gen),
            },
        )
        for _ in range(count)
    ]


def plain_loop(model: nn.Module, mbs: list[MicroBatch], scale: float) -> list[Any]:
    outs = []
    for mb in mbs:
        out = model(*mb.args, **mb.kwargs)
        loss = out["loss"] if isinstance(out, dict) else out
        if isinstance(out, tuple):
            loss = out[0] if out[0].dim() == 0 else out[-1]
        (scale * loss).backward()
        outs.append(out)
    return outs


def assert_same_grads(ref: nn.Module, got: nn.Module, rtol: float = 1e-6) -> None:
    for (name, p), q in zip(ref.named_parameters(), got.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=1e-7, msg=name)


STRATEGIES = {
    "pipelined": lambda: PipelinedExecution("B1", "B2", "B3"),
    "sharded": lambda: ShardedExecution(Stage("B1").ipu(0), Stage("B2", "B3").ipu(1)),
    "serial-phased": lambda: SerialPhasedExecution("B1", "B2", "B3"),
}


@pytest.mark.parametrize("returns", ["tuple-last", "tuple-first", "dict"])
@pytest.mark.parametrize("staging", ["auto", "eager"])
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_keyword_inputs_and_the_loss_anywhere(returns: str, staging: Any, name: str) -> None:
    """Keyword inputs reach the model; the loss is found last, first or under 'loss'."""
    torch.manual_seed(0)
    base = Net(returns)
    mbs = batches(4)
    ref = copy.deepcopy(base)
    expected = plain_loop(ref, mbs, 0.25)
    model = copy.deepcopy(base)
    runner = StageRunner(model, STRATEGIES[name](), num_devices=3, staging=staging)
    outs = runner.forward_backward(mbs, grad_scale=0.25)
    assert runner.staged_at_run_time() == (staging == "eager")
    assert len(runner.plan(2).stages) == (2 if name == "sharded" else 3)
    assert_same_grads(ref, model)
    for out, exp in zip(outs, expected, strict=True):
        if isinstance(exp, dict):
            assert set(out) == {"logits", "loss"}
            out, exp = out["logits"], exp["logits"]
        elif isinstance(exp, tuple):
            out, exp = (
                out[1 if returns == "tuple-first" else 0],
                exp[1 if returns == "tuple-first" else 0],
            )
        torch.testing.assert_close(out, exp.detach(), rtol=1e-6, atol=0)


def test_traced_and_eager_paths_train_to_the_same_weights() -> None:
    """The same model, both paths, several optimizer steps: the same weights."""
    torch.manual_seed(0)
    base = Net()
    weights = []
    for staging in ("auto", "eager"):
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        runner = StageRunner(model, PipelinedExecution(), num_devices=3, staging=staging)
        for step in range(3):
            opt.zero_grad()
            runner.forward_backward(batches(4, seed=step), grad_scale=0.25)
            opt.step()
        weights.append([p.detach().clone() for p in model.parameters()])
    for traced, eager in zip(*weights, strict=True):
        torch.testing.assert_close(eager, traced, rtol=1e-5, atol=1e-7)


def test_eager_stages_follow_the_blocks_and_the_profile_shows_each() -> None:
    torch.manual_seed(0)
    runner = StageRunner(Net(), PipelinedExecution(), num_devices=3, staging="eager")
    threads = torch.get_num_threads()
    with record_schedule() as events:
        runner.forward_backward(batches(3))
    assert torch.get_num_threads() == threads  # the stages' share is set around the step only
    plan = runner.plan(2)
    assert [(s.blocks, s.ipu_id) for s in plan.stages] == [
        (("B1",), 0),
        (("B2",), 1),
        (("B3",), 2),
    ]
    forwards = sorted((e.stage, e.micro_batch) for e in events if e.kind == "F")
    assert forwards == [(s, m) for s in range(3) for m in range(3)]
    # The gradient reaches B2's and B3's inputs (activations), not B1's (the data): stage 0
    # takes the backward from B2's input on.
    backwards = sorted((e.stage, e.micro_batch) for e in events if e.kind == "B")
    assert backwards == [(s, m) for s in range(3) for m in range(3)]
    for e in events:
        assert e.end >= e.start


class Untraceable(nn.Module):
    """What real models do that torch.fx cannot trace, each switched on by ``kind``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.embed = BeginBlock(nn.Linear(6, 8), "E", ipu_id=0)
        self.body = BeginBlock(nn.Linear(8, 8), "L", ipu_id=1)
        self.register_buffer("mask", torch.tril(torch.ones(16, 16)))
        self.calls = 0

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Any:
        h = self.embed(x)
        if self.kind == "branch" and h.mean() > 0:  # control flow on a tensor value
            h = h * 2
        if self.kind == "shape":  # a traced size used as a number
            h = h + torch.zeros(h.shape[0], h.shape[-1])
        if self.kind == "unpack":  # star-unpacking a traced shape
            *lead, d = h.shape
            h = h.reshape(*lead, d)
        if self.kind == "buffer":  # a buffer sliced by a run-time length
            length = h.shape[0]
            h = self.mask[:length, :length] @ h
        if self.kind == "attribute":  # an attribute set in forward
            self.last_hidden = h
        h = self.body(h)
        self.calls += 1
        return {"loss": nn.functional.mse_loss(h, labels), "hidden": h}


@pytest.mark.parametrize("kind", ["branch", "shape", "unpack", "buffer", "attribute"])
@pytest.mark.parametrize("strategy", ["pipelined", "sharded"])
def test_models_torch_fx_cannot_trace_train_as_in_plain_torch(kind: str, strategy: str) -> None:
    torch.manual_seed(0)
    base = Untraceable(kind)
    gen = torch.Generator().manual_seed(3)
    mbs = [
        MicroBatch((torch.randn(5, 6, generator=gen), torch.randn(5, 8, generator=gen)), {})
        for _ in range(2)
    ]
    ref, model = copy.deepcopy(base), copy.deepcopy(base)
    plain_loop(ref, mbs, 0.5)
    chosen = PipelinedExecution() if strategy == "pipelined" else ShardedExecution()
    runner = StageRunner(model, chosen, num_devices=2)
    runner.forward_backward(mbs, grad_scale=0.5)
    assert runner.staged_at_run_time()
    assert_same_grads(ref, model)
    assert model.calls == 2  # the forward ran once per micro-batch, as written
    if kind == "attribute":
        assert isinstance(model.last_hidden, torch.Tensor)  # no proxy left behind
    assert [s.blocks for s in runner.plan(2).stages] == [("E",), ("L",)]


def test_an_attribute_set_in_forward_leaves_no_proxy_on_a_traceable_path() -> None:
    """torch.fx "traces" a forward that sets an attribute but leaves a Proxy: not kept."""

    class SetsAttr(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = BeginBlock(nn.Linear(2, 2), "A", ipu_id=0)
            self.l2 = BeginBlock(nn.Linear(2, 1), "B", ipu_id=1)
            self.seen: Any = "nothing yet"

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.l1(x)
            self.seen = h
            return self.l2(h).sum()

    model = SetsAttr()
    runner = StageRunner(model, PipelinedExecution(), num_devices=2)
    runner.forward_backward([(torch.ones(3, 2),), (torch.ones(3, 2),)])
    assert runner.staged_at_run_time()
    assert isinstance(model.seen, torch.Tensor) and not isinstance(model.seen, torch.fx.Proxy)


class Tied(nn.Module):
    """An embedding whose weight the output layer reuses, on stages 0 and 2."""

    def __init__(self, head_ipu: int, untraceable: bool = False) -> None:
        super().__init__()
        self.embed = BeginBlock(nn.Embedding(10, 6), "E", ipu_id=0)
        self.body = BeginBlock(nn.Linear(6, 6), "L", ipu_id=1)
        self.head = BeginBlock(nn.Linear(6, 10, bias=False), "H", ipu_id=head_ipu)
        self.head.weight = self.embed.weight
        self.untraceable = untraceable

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(self.embed(ids)))
        if self.untraceable and h.sum() > 1e9:
            h = h * 0
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), ids.flatten())


@pytest.mark.parametrize("untraceable", [False, True], ids=["traced", "eager"])
def test_weights_tied_across_stages_on_one_device_sum_their_gradients(untraceable: bool) -> None:
    torch.manual_seed(0)
    base = Tied(head_ipu=0, untraceable=untraceable)
    mbs = [(torch.randint(0, 10, (3, 4)),) for _ in range(3)]
    ref, model = copy.deepcopy(base), copy.deepcopy(base)
    assert model.head.weight is model.embed.weight
    for (ids,) in mbs:
        (ref(ids) / 3).backward()
    runner = StageRunner(model, PipelinedExecution(AutoStage.AutoIncrement), num_devices=2)
    runner.forward_backward(mbs, grad_scale=1 / 3)
    assert runner.staged_at_run_time() == untraceable
    assert [(s.blocks, s.ipu_id) for s in runner.plan(1).stages] == [
        (("E",), 0),
        (("L",), 1),
        (("H",), 0),
    ]
    assert_same_grads(ref, model, rtol=1e-5)


@pytest.mark.parametrize("untraceable", [False, True], ids=["traced", "eager"])
def test_weights_tied_across_devices_are_refused_as_poptorch_does(untraceable: bool) -> None:
    runner = StageRunner(
        Tied(head_ipu=2, untraceable=untraceable), PipelinedExecution(), num_devices=3
    )
    with pytest.raises(
        PipelineError,
        match=r"used by stage 0 and stage 2 on different devices \(ipu 0 and ipu 2\).*same ipu_id",
    ):
        runner.forward_backward([(torch.randint(0, 10, (3, 4)),)] * 3)
    assert all(p.grad is None for p in runner.model.parameters())


def test_eager_blocks_that_go_back_a_stage_are_refused() -> None:
    class Back(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with Block("A"):
                x = x * 2
            if x.sum() > 0:
                with Block("B"):
                    x = x + 1
            with Block("A"):
                return x.sum()

    runner = StageRunner(Back(), PipelinedExecution("A", "B"), num_devices=2)
    with pytest.raises(
        PipelineError, match=r"block 'A' \(stage 0\) runs after block 'B' \(stage 1\)"
    ):
        runner.forward([(torch.ones(2),)])


def test_a_missing_input_is_a_clear_error() -> None:
    runner = StageRunner(Net(), PipelinedExecution(), num_devices=3)
    with pytest.raises(PipelineError, match=r"Net\.forward cannot take the micro-batch's inputs"):
        runner.forward([MicroBatch((), {"labels": torch.zeros(5)})])


def test_training_model_takes_keyword_inputs_through_the_pipeline() -> None:
    """The issue's failure: a pipelined model called with keywords lost them."""
    torch.manual_seed(0)
    base = Net("dict")
    mbs = batches(3)
    ref = copy.deepcopy(base)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    plain_loop(ref, mbs, 1 / 3)
    ref_opt.step()
    model = copy.deepcopy(base)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(3)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    out = training(
        x=torch.cat([mb.kwargs["x"] for mb in mbs]),
        labels=torch.cat([mb.kwargs["labels"] for mb in mbs]),
    )
    assert set(out) == {"logits", "loss"} and out["logits"].shape == (5, 4)
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("returns", ["dict", "tuple-first"])
def test_unstaged_executor_finds_the_loss_by_key_or_first(returns: str) -> None:
    """The plain (not staged) executor: keyword inputs, the loss under 'loss' or first."""
    torch.manual_seed(0)
    base = Net(returns)
    poptorch.removeBlocks(base)
    mbs = batches(2)
    ref = copy.deepcopy(base)
    plain_loop(ref, mbs, 0.5)
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    model = copy.deepcopy(base)
    opts = poptorch.Options().replicationFactor(2)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    training(
        x=torch.cat([mb.kwargs["x"] for mb in mbs]),
        labels=torch.cat([mb.kwargs["labels"] for mb in mbs]),
    )
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=name)


def test_unstaged_executor_without_a_loss_key_is_a_clear_error() -> None:
    class NoLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"logits": self.l(x)}

    model = NoLoss()
    training = poptorch.trainingModel(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(poptorch.ExecutorError, match=r"keys \['logits'\] and no 'loss'"):
        training(torch.ones(2, 2))


class Checkpointed(nn.Module):
    """recomputationCheckpoint on a tuple, a dict and from a forward hook, in every block."""

    def __init__(self, branch: bool) -> None:
        super().__init__()
        self.l1 = BeginBlock(nn.Linear(4, 4), "A", ipu_id=0)
        self.l2 = BeginBlock(nn.Linear(4, 4), "B", ipu_id=1)
        self.branch = branch
        self.l1.register_forward_hook(lambda m, i, o: poptorch.recomputationCheckpoint(o))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, g = poptorch.recomputationCheckpoint((self.l1(x), x))
        if self.branch and h.sum() > 1e9:
            h = h * 0
        parts = poptorch.recomputationCheckpoint({"h": h, "g": g, "n": 3})
        a, b = poptorch.recomputationCheckpoint(self.l2(parts["h"]), parts["g"])
        return (a * b).sum() / parts["n"]


@pytest.mark.parametrize("branch", [False, True], ids=["traced", "eager"])
def test_recomputation_checkpoint_takes_any_value_in_hooks_and_while_staging(branch: bool) -> None:
    torch.manual_seed(0)
    base = Checkpointed(branch)
    xs = [(torch.randn(3, 4),) for _ in range(2)]
    ref, model = copy.deepcopy(base), copy.deepcopy(base)
    for (x,) in xs:
        ref(x).backward()
    runner = StageRunner(model, PipelinedExecution(), num_devices=2)
    runner.forward_backward(xs)
    assert runner.staged_at_run_time() == branch
    assert len(runner.plan(1).stages) == 2
    assert_same_grads(ref, model)
    assert poptorch.recomputationCheckpoint([1, 2]) == [1, 2]


class Layered(nn.Module):
    """Three BeginBlock layers; with ``hooks``, each output is checkpointed from a hook."""

    def __init__(self, hooks: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [
                BeginBlock(
                    nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 16)), f"L{i}", i
                )
                for i in range(3)
            ]
        )
        if hooks:
            for layer in self.layers:
                layer.register_forward_hook(lambda m, i, o: poptorch.recomputationCheckpoint(o))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).mean()


def saved_bytes(runner: StageRunner, xs: list[tuple[torch.Tensor]]) -> int:
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        runner.forward_backward(xs)
    return total


def test_recomputation_checkpoints_recompute_their_blocks_on_the_eager_path() -> None:
    """Checkpointed layers keep fewer activations for backward; the gradients are the same."""
    torch.manual_seed(0)
    base = Layered(hooks=False)
    checkpointed = Layered(hooks=True)
    checkpointed.load_state_dict(base.state_dict())
    xs = [(torch.randn(32, 16),) for _ in range(3)]
    ref, plain = copy.deepcopy(base), copy.deepcopy(base)
    for _ in range(2):
        for (x,) in xs:
            ref(x).backward()
    kept, recomputed = (
        StageRunner(model, PipelinedExecution(), num_devices=3, staging="eager")
        for model in (plain, checkpointed)
    )
    for runner in (kept, recomputed):
        runner.forward_backward(xs)  # the first call discovers the stages and checkpoints
    assert saved_bytes(recomputed, xs) < saved_bytes(kept, xs) / 2
    assert_same_grads(ref, checkpointed)
    assert_same_grads(ref, plain)
    assert not hasattr(checkpointed.layers[0], "__dict__") or "forward" not in vars(
        checkpointed.layers[0]
    )


def test_placed_block_contexts_in_an_untraceable_forward_stage_through_the_executor() -> None:
    """No strategy: the first call sees Block(ipu_id=...) and restages, here eagerly."""

    class Placed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with Block(ipu_id=0):
                h = torch.relu(self.a(x))
            if h.sum() < -1e9:  # control flow on a value: no trace
                h = -h
            with Block(ipu_id=1):
                return self.b(h).pow(2).mean()

    torch.manual_seed(0)
    base = Placed()
    xs = torch.randn(4, 3, 4)
    ref, model = copy.deepcopy(base), copy.deepcopy(base)
    for x in xs:
        (ref(x) / 4).backward()
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    with record_schedule() as events:
        training(xs.flatten(0, 1))
    assert {(e.stage, e.device) for e in events} == {(0, 0), (1, 1)}
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7, msg=name)


def test_a_python_side_effect_in_forward_happens_on_every_call() -> None:
    """A traced graph would not repeat ``self.calls += 1``: the model runs eagerly."""

    class Counts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = BeginBlock(nn.Linear(2, 2), "A", ipu_id=0)
            self.l2 = BeginBlock(nn.Linear(2, 1), "B", ipu_id=1)
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.l2(self.l1(x)).sum()

    model = Counts()
    runner = StageRunner(model, PipelinedExecution(), num_devices=2)
    runner.forward_backward([(torch.ones(3, 2),)] * 2)
    runner.forward_backward([(torch.ones(3, 2),)] * 2)
    assert model.calls == 4 and runner.staged_at_run_time()
