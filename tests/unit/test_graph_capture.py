"""The captured micro-step against today's eager path, bit for bit, on the CPU.

The capture seam's CPU backend (:class:`RerunGraphs`, registered for ``"cpu"`` here only)
runs a captured step again on the same static inputs, ``.grad`` buffers and outputs, and
checks that every address the step uses is the one it used at capture. So everything but
the CUDA calls is checked here: warm-up, static buffers, the scale as data, zeroing per
update, the guards, the cache, copying the outputs out, and each case that must stay eager.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import popdist_torch as poptorch
from popdist import env
from popdist_torch.execution.capture import seam
from popdist_torch.execution.capture.facts import StepWatch
from popdist_torch.execution.capture.graphed import WARMUP_CALLS
from popdist_torch.execution.runners import LocalReplicaRunner

pytestmark = pytest.mark.unit

Optimizer = Callable[[nn.Module], torch.optim.Optimizer]
CALLS = 5  # 2 warm-up calls, the capture, 2 replayed calls


class Mlp(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)
        self.unused = nn.Linear(2, 2) if unused else None

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(torch.tanh(self.fc1(x)))
        return out, nn.functional.cross_entropy(out, y)


def batch(n: int, seed: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=gen).to(dtype), torch.randint(0, 3, (n,), generator=gen)


@contextlib.contextmanager
def cpu_graphs(monkeypatch: pytest.MonkeyPatch, on: bool) -> Iterator[None]:
    with monkeypatch.context() as patch:
        if on:
            patch.setitem(seam.BACKENDS, "cpu", seam.RerunGraphs)
        yield


def train(
    monkeypatch: pytest.MonkeyPatch,
    *,
    graphs: bool,
    opts: Callable[[], poptorch.Options],
    optimizer: Optimizer,
    model: Callable[[], nn.Module] = Mlp,
    sizes: list[int] | None = None,
    between: Callable[[int, nn.Module, torch.optim.Optimizer], None] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[list[Any], list[torch.Tensor], poptorch.PoplarExecutor]:
    """The calls' outputs, the final weights and the wrapped model of one run."""
    options = opts()
    factor = options.device_iterations * options.replication_factor
    factor *= options.Training.gradient_accumulation
    with cpu_graphs(monkeypatch, graphs):
        torch.manual_seed(1)
        module = model()
        if dtype != torch.float32:
            module = module.to(dtype)
        opt = optimizer(module)
        wrapped = poptorch.trainingModel(module, options, opt)
        outputs = []
        for call, size in enumerate(sizes or [2] * CALLS):
            outputs.append(wrapped(*batch(factor * size, call, dtype)))
            if between is not None:
                between(call, module, opt)
    return outputs, [p.detach().clone() for p in module.parameters()], wrapped


def same(a: Any, b: Any) -> bool:
    leaves_a, leaves_b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        torch.equal(x, y) for x, y in zip(leaves_a, leaves_b, strict=True)
    )


def backend_of(wrapped: poptorch.PoplarExecutor) -> seam.RerunGraphs:
    runner = wrapped.replica_runner
    assert isinstance(runner, LocalReplicaRunner) and runner.graphs is not None, "not graphed"
    backend = runner.graphs.backend
    assert isinstance(backend, seam.RerunGraphs)
    return backend


def check_equal(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> seam.RerunGraphs:
    """Run eagerly and graphed; assert every output and weight equal; the graphed backend."""
    eager_out, eager_w, eager = train(monkeypatch, graphs=False, **kwargs)
    graph_out, graph_w, graphed = train(monkeypatch, graphs=True, **kwargs)
    runner = eager.replica_runner
    assert isinstance(runner, LocalReplicaRunner) and runner.graphs is None
    assert all(same(a, b) for a, b in zip(eager_out, graph_out, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager_w, graph_w, strict=True))
    assert not torch.equal(eager_w[0], train_free_weights())  # it trained
    return backend_of(graphed)


def train_free_weights() -> torch.Tensor:
    torch.manual_seed(1)
    return Mlp().fc1.weight.detach().clone()


def layout(di: int, ga: int, r: int, mode: Any = None) -> Callable[[], poptorch.Options]:
    def make() -> poptorch.Options:
        opts = poptorch.Options().deviceIterations(di).replicationFactor(r)
        opts.Training.gradientAccumulation(ga)
        if mode is not None:
            opts.outputMode(*mode) if isinstance(mode, tuple) else opts.outputMode(mode)
        return opts

    return make


OPTIMIZERS: dict[str, Optimizer] = {
    "sgd-momentum-decay": lambda m: torch.optim.SGD(
        m.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01
    ),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=0.01),
    "poptorch-sgd-loss-scaling": lambda m: poptorch.optim.SGD(
        m.parameters(), lr=0.1, loss_scaling=8.0
    ),
    "poptorch-lamb": lambda m: poptorch.optim.LAMB(m.parameters(), lr=0.01),
}


@pytest.mark.parametrize(
    ("di", "ga", "r", "name"),
    [
        (1, 1, 2, "sgd-momentum-decay"),
        (2, 1, 2, "adamw"),
        (1, 2, 4, "poptorch-sgd-loss-scaling"),
        (2, 4, 2, "poptorch-lamb"),
        (2, 2, 4, "adamw"),
    ],
)
def test_replayed_steps_train_as_eager_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, di: int, ga: int, r: int, name: str
) -> None:
    backend = check_equal(monkeypatch, opts=layout(di, ga, r), optimizer=OPTIMIZERS[name])
    assert backend.captures == 1
    # every micro-step after the capture's first replays
    assert backend.replays == (CALLS - WARMUP_CALLS) * di * ga - 1


@pytest.mark.parametrize(
    "mode",
    [
        poptorch.OutputMode.Final,
        poptorch.OutputMode.All,
        poptorch.OutputMode.Sum,
        (poptorch.OutputMode.EveryN, 2),
    ],
    ids=["final", "all", "sum", "every-2"],
)
def test_every_output_mode_returns_copies_of_the_replayed_outputs(
    monkeypatch: pytest.MonkeyPatch, mode: Any
) -> None:
    """A kept output is copied out: a later replay does not change an earlier call's."""
    backend = check_equal(
        monkeypatch, opts=layout(2, 2, 2, mode), optimizer=OPTIMIZERS["sgd-momentum-decay"]
    )
    assert backend.replays > 0


def test_a_half_model_with_poptorch_s_float32_optimizer(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = check_equal(
        monkeypatch,
        opts=layout(1, 2, 2),
        optimizer=lambda m: poptorch.optim.AdamW(m.parameters(), lr=0.01, loss_scaling=16.0),
        dtype=torch.float16,
    )
    assert backend.replays > 0


def test_a_scheduler_and_a_new_loss_scale_take_effect_without_a_new_capture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def between(call: int, module: nn.Module, opt: torch.optim.Optimizer) -> None:
        for group in opt.param_groups:
            group["lr"] *= 0.5
        if call == 3:
            assert isinstance(opt, poptorch.optim.SGD)
            opt.loss_scaling = 2.0  # the scale is data: the same graph replays

    backend = check_equal(
        monkeypatch,
        opts=layout(1, 2, 2),
        optimizer=OPTIMIZERS["poptorch-sgd-loss-scaling"],
        sizes=[2] * 7,
        between=between,
    )
    assert backend.captures == 1


def test_a_parameter_frozen_mid_run_is_captured_again(monkeypatch: pytest.MonkeyPatch) -> None:
    def between(call: int, module: nn.Module, opt: torch.optim.Optimizer) -> None:
        if call == 3:
            module.fc1.weight.requires_grad_(False)  # type: ignore[union-attr]

    backend = check_equal(
        monkeypatch,
        opts=layout(1, 1, 2),
        optimizer=OPTIMIZERS["adamw"],
        sizes=[2] * 8,
        between=between,
    )
    assert backend.captures == 2  # calls 3 and 7 (after two eager calls with the new guard)


def test_a_parameter_frozen_between_the_warm_up_and_the_capture(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm-up calls count under the guard the capture bakes in: the frozen parameter
    gets no .grad buffer (weight decay would move it)."""

    def between(call: int, module: nn.Module, opt: torch.optim.Optimizer) -> None:
        if call == 1:
            module.fc1.bias.requires_grad_(False)  # type: ignore[union-attr]

    backend = check_equal(
        monkeypatch,
        opts=layout(1, 1, 2),
        optimizer=OPTIMIZERS["sgd-momentum-decay"],
        sizes=[2] * 6,
        between=between,
    )
    assert backend.captures == 1  # at call 5, after two eager calls with the frozen bias


def test_moved_parameters_and_a_module_in_eval_mode_fail_the_guard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def between(call: int, module: nn.Module, opt: torch.optim.Optimizer) -> None:
        if call == 3:
            with torch.no_grad():
                module.fc2.weight.data = module.fc2.weight.data.clone()  # a new address
        if call == 6:
            module.fc1.eval()  # the executor sets the top module's mode only

    backend = check_equal(
        monkeypatch,
        opts=layout(1, 1, 2),
        optimizer=OPTIMIZERS["sgd-momentum-decay"],
        sizes=[2] * 10,
        between=between,
    )
    assert backend.captures == 3


def test_a_short_last_batch_gets_a_graph_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = [2, 2, 2, 2, 1, 2, 2, 1, 2, 1, 2, 1]  # an epoch's last batch is short
    backend = check_equal(
        monkeypatch, opts=layout(1, 2, 2), optimizer=OPTIMIZERS["adamw"], sizes=sizes
    )
    assert backend.captures == 2  # the full batch at call 3, the short one at its third call


class Weighted(Mlp):
    def forward(  # type: ignore[override]
        self, x: torch.Tensor, y: torch.Tensor, weight: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, loss = super().forward(x, y)
        return out, loss * weight


def test_a_new_non_tensor_argument_is_a_new_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay would keep the captured Python float: another value gets a graph of its own."""
    weights = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0]
    results = []
    for graphs in (False, True):
        with cpu_graphs(monkeypatch, graphs):
            torch.manual_seed(1)
            model = Weighted()
            wrapped = poptorch.trainingModel(model, layout(1, 1, 2)(), OPTIMIZERS["adamw"](model))
            outs = [wrapped(*batch(4, call), w) for call, w in enumerate(weights)]
            results.append((outs, [p.detach().clone() for p in model.parameters()], wrapped))
    (eager_out, eager_w, _), (out, weights_after, wrapped) = results
    assert all(same(a, b) for a, b in zip(eager_out, out, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager_w, weights_after, strict=True))
    assert backend_of(wrapped).captures == 2


def test_an_unused_parameter_gets_no_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = check_equal(
        monkeypatch, opts=layout(2, 1, 2), optimizer=OPTIMIZERS["adamw"], model=lambda: Mlp(True)
    )
    _, _, wrapped = train(
        monkeypatch, graphs=True, opts=layout(2, 1, 2), optimizer=OPTIMIZERS["adamw"],
        model=lambda: Mlp(True),
    )  # fmt: skip
    module = wrapped.model
    assert isinstance(module, Mlp) and module.unused is not None
    assert module.unused.weight.grad is None and module.fc1.weight.grad is not None
    assert backend.replays > 0


def test_a_failed_capture_runs_eagerly_for_good_with_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Refusing(seam.RerunGraphs):
        def capture(self, step: Any, addresses: Any) -> Any:
            raise RuntimeError("operation not permitted when stream is capturing")

    eager_out, eager_w, _ = train(
        monkeypatch, graphs=False, opts=layout(2, 2, 2), optimizer=OPTIMIZERS["adamw"]
    )
    monkeypatch.setitem(seam.BACKENDS, "cpu", Refusing)
    with caplog.at_level(logging.WARNING, logger="popdist_torch"):
        out, weights, wrapped = train(
            monkeypatch, graphs=False, opts=layout(2, 2, 2), optimizer=OPTIMIZERS["adamw"]
        )
    assert all(same(a, b) for a, b in zip(eager_out, out, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager_w, weights, strict=True))
    lines = [r.getMessage() for r in caplog.records if "capture failed" in r.getMessage()]
    assert lines == [
        "the training micro-step runs eagerly from now on: its capture failed (RuntimeError: "
        "operation not permitted when stream is capturing)"
    ]
    runner = wrapped.replica_runner
    assert isinstance(runner, LocalReplicaRunner) and runner.graphs is None


# -- the cases that keep today's path --------------------------------------------------------


class Dropout(Mlp):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(nn.functional.dropout(torch.tanh(self.fc1(x)), 0.5, self.training))
        return out, nn.functional.cross_entropy(out, y)


class Norm(Mlp):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(self.norm(self.fc1(x)))
        return out, nn.functional.cross_entropy(out, y)


class Checkpointed(Mlp):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.utils.checkpoint.checkpoint(self.fc1, x, use_reentrant=False)
        out = self.fc2(torch.tanh(hidden))
        return out, nn.functional.cross_entropy(out, y)


class SavedHooks(Mlp):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            return super().forward(x, y)


class Item(Mlp):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, loss = super().forward(x, y)
        return out, loss * (2.0 if float(loss.detach()) > 100 else 1.0)


class Hooked(Mlp):
    def __init__(self) -> None:
        super().__init__()
        self.fc1.register_forward_hook(lambda module, args, out: None)


class TensorHooked(Mlp):
    def __init__(self) -> None:
        super().__init__()
        self.fc2.weight.register_hook(lambda grad: grad)


class Scaled(Mlp):
    def forward(  # type: ignore[override]
        self, x: torch.Tensor, y: torch.Tensor, factor: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, loss = super().forward(x, y)
        return out, loss * factor


EAGER_MODELS: dict[str, tuple[Callable[[], nn.Module], str]] = {
    "dropout": (Dropout, "the step draws random numbers (aten.bernoulli)"),
    "batchnorm": (Norm, "one after the other (BatchNorm updates its running statistics)"),
    "checkpointing": (Checkpointed, "the replicas run one after the other (vmap:"),
    "saved-tensor-hooks": (SavedHooks, "saved-tensor hooks (activation checkpointing)"),
    "item": (Item, "the replicas run one after the other (vmap:"),
    "forward-hook": (Hooked, "hooks run in the step (forward hook on fc1)"),
    "tensor-hook": (TensorHooked, "hooks run in the step (tensor hook on fc2.weight)"),
}


@pytest.mark.parametrize("case", list(EAGER_MODELS))
def test_a_step_a_replay_would_not_repeat_stays_eager(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    model, reason = EAGER_MODELS[case]
    kwargs: dict[str, Any] = {"opts": layout(1, 2, 2), "optimizer": OPTIMIZERS["adamw"]}
    eager_out, eager_w, _ = train(monkeypatch, graphs=False, model=model, **kwargs)
    with caplog.at_level(logging.INFO, logger="popdist_torch"):
        out, weights, wrapped = train(monkeypatch, graphs=True, model=model, **kwargs)
    runner = wrapped.replica_runner
    assert isinstance(runner, LocalReplicaRunner) and runner.graphs is None
    lines = [r.getMessage() for r in caplog.records if "not captured in a graph" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0], lines
    assert all(same(a, b) for a, b in zip(eager_out, out, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager_w, weights, strict=True))


def test_a_0_dim_tensor_argument_stays_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    with cpu_graphs(monkeypatch, True):
        wrapped = poptorch.trainingModel(Scaled(), layout(1, 1, 2)())
        for call in range(CALLS):
            wrapped(*batch(4, call), torch.tensor(0.5))
    runner = wrapped.replica_runner
    assert isinstance(runner, LocalReplicaRunner) and runner.graphs is None


def _graphs_after_wrapping(
    monkeypatch: pytest.MonkeyPatch, opts: poptorch.Options, training: bool = True
) -> Any:
    with cpu_graphs(monkeypatch, True):
        model = Mlp()
        wrapped = (
            poptorch.trainingModel(model, opts)
            if training
            else poptorch.inferenceModel(model, opts)
        )
        wrapped(*batch(opts.replication_factor * opts.device_iterations * 2, 0))
    runner = wrapped.replica_runner
    return getattr(runner, "graphs", "no local runner")


def test_the_plan_s_excluded_cases_never_build_a_graphed_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _graphs_after_wrapping(monkeypatch, layout(1, 1, 2)()) is not None  # the control
    autocast = layout(1, 1, 2)()
    autocast.Precision.autocastEnabled(True)
    deterministic = layout(1, 1, 2)()
    deterministic.Training.deterministicReduction()
    excluded = {
        "autocast": autocast,
        "an Output___ anchor": layout(1, 1, 2)().anchorTensor("hidden", "Output___fc1"),
        "the deterministic reduction": deterministic,
        "pipeline stages": layout(1, 1, 2)().setExecutionStrategy(poptorch.PipelinedExecution()),
        "one local replica": layout(1, 1, 1)(),
    }
    for case, opts in excluded.items():
        assert _graphs_after_wrapping(monkeypatch, opts) in (None, "no local runner"), case
    assert _graphs_after_wrapping(monkeypatch, layout(1, 1, 2)(), training=False) is None


def test_the_opt_outs_keep_every_step_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    opts = layout(1, 1, 2)()
    opts.Training.cudaGraphs(False)
    assert _graphs_after_wrapping(monkeypatch, opts) is None
    monkeypatch.setenv(env.CUDA_GRAPHS, "0")
    assert _graphs_after_wrapping(monkeypatch, layout(1, 1, 2)()) is None


def test_the_watch_sees_random_data_dependent_and_saved_tensor_hook_operations() -> None:
    x = torch.randn(4, 3, requires_grad=True)
    with StepWatch() as watch:
        nn.functional.dropout(x, 0.5)
        float(x.detach().sum())
        torch.nonzero(x > 0)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            (x * 2).sum().backward()
    assert watch.random_ops == ["aten.bernoulli_"]
    assert watch.data_dependent_ops == ["aten._local_scalar_dense", "aten.nonzero"]
    assert watch.saved_tensor_hooks
    quiet = StepWatch()
    with quiet:
        (x * 2).sum().backward()
    assert (quiet.random_ops, quiet.data_dependent_ops, quiet.saved_tensor_hooks) == ([], [], False)


def test_the_cpu_backend_catches_a_buffer_moved_since_the_capture() -> None:
    backend = seam.RerunGraphs()
    grad = torch.zeros(2)
    where = [grad]
    graph, outputs = backend.capture(lambda: where[0] + 1, lambda: (where[0].data_ptr(),))
    graph.replay()
    where[0] = torch.zeros(2)  # what a CUDA replay would not see
    with pytest.raises(poptorch.ExecutorError, match="buffers moved since its capture"):
        graph.replay()
    assert backend.captures == 1 and backend.replays == 1 and copy.copy(outputs) is not None


# -- what changes after the first call --------------------------------------------------------


class DropoutRate(Mlp):
    def forward(  # type: ignore[override]
        self, x: torch.Tensor, y: torch.Tensor, p: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(nn.functional.dropout(torch.tanh(self.fc1(x)), p, self.training))
        return out, nn.functional.cross_entropy(out, y)


def test_a_new_signature_s_warm_up_is_watched_too(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """forward(x, y, p) captured with p=0 (no random numbers), then called with p=0.5:
    the new signature's first warm-up step draws them, so the step stays eager."""
    rates = [0.0] * 4 + [0.5] * 4
    results = []
    for graphs in (False, True):
        with cpu_graphs(monkeypatch, graphs), caplog.at_level(logging.INFO, "popdist_torch"):
            torch.manual_seed(1)
            model = DropoutRate()
            wrapped = poptorch.trainingModel(model, layout(1, 1, 2)(), OPTIMIZERS["adamw"](model))
            outs = [wrapped(*batch(4, call), p) for call, p in enumerate(rates)]
            results.append((outs, [p.detach().clone() for p in model.parameters()], wrapped))
    (eager_out, eager_w, _), (out, weights, wrapped) = results
    assert all(same(a, b) for a, b in zip(eager_out, out, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager_w, weights, strict=True))
    runner = wrapped.replica_runner
    assert isinstance(runner, LocalReplicaRunner) and runner.graphs is None
    lines = [r.getMessage() for r in caplog.records if "not captured in a graph" in r.getMessage()]
    assert len(lines) == 1 and "random numbers (aten.bernoulli)" in lines[0], lines


def test_a_hook_registered_after_the_capture_keeps_the_step_eager(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def between(call: int, module: nn.Module, opt: torch.optim.Optimizer) -> None:
        if call == 3:
            module.fc1.register_forward_hook(lambda m, args, out: None)  # type: ignore[union-attr]

    kwargs: dict[str, Any] = {
        "opts": layout(1, 1, 2),
        "optimizer": OPTIMIZERS["adamw"],
        "sizes": [2] * 8,
        "between": between,
    }
    eager_out, eager_w, _ = train(monkeypatch, graphs=False, **kwargs)
    with caplog.at_level(logging.INFO, logger="popdist_torch"):
        out, weights, wrapped = train(monkeypatch, graphs=True, **kwargs)
    runner = wrapped.replica_runner
    assert isinstance(runner, LocalReplicaRunner) and runner.graphs is None
    lines = [r.getMessage() for r in caplog.records if "not captured in a graph" in r.getMessage()]
    assert len(lines) == 1 and "hooks run in the step (forward hook on fc1)" in lines[0], lines
    assert all(same(a, b) for a, b in zip(eager_out, out, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager_w, weights, strict=True))


class Masked(Mlp):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mask", torch.ones(8))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc2(torch.tanh(self.fc1(x)) * self.mask)
        return out, nn.functional.cross_entropy(out, y)


def test_a_rebound_buffer_fails_the_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.mask = new tensor``: a replay would read the old (freed) one on a GPU."""

    def between(call: int, module: nn.Module, opt: torch.optim.Optimizer) -> None:
        if call == 3:
            module.mask = torch.full((8,), 0.5)

    backend = check_equal(
        monkeypatch,
        opts=layout(1, 1, 2),
        optimizer=OPTIMIZERS["sgd-momentum-decay"],
        model=Masked,
        sizes=[2] * 8,
        between=between,
    )
    assert backend.captures == 2  # calls 2 and 6


def test_a_new_dtype_gets_gradient_buffers_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.double()`` after a capture, the gradients set to None first (else it converts
    the buffers too): the float32 .grad buffers cannot be the double parameters' gradients."""
    results = []
    for graphs in (False, True):
        with cpu_graphs(monkeypatch, graphs):
            torch.manual_seed(1)
            model: nn.Module = Mlp()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            wrapped = poptorch.trainingModel(model, layout(1, 1, 2)(), opt)
            outs = []
            for call in range(8):
                dtype = torch.float32 if call < 4 else torch.float64
                if call == 4:
                    opt.zero_grad(set_to_none=True)
                    model.double()
                outs.append(wrapped(*batch(4, call, dtype)))
            results.append((outs, [p.detach().clone() for p in model.parameters()], wrapped))
    (eager_out, eager_w, _), (out, weights, wrapped) = results
    assert all(same(a, b) for a, b in zip(eager_out, out, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(eager_w, weights, strict=True))
    assert backend_of(wrapped).captures == 2 and weights[0].dtype == torch.float64


# -- the CUDA backend's streams, on fakes ----------------------------------------------------


class FakeStream:
    def __init__(self, name: str = "side", device: Any = None) -> None:
        self.name = name
        self.waited: list[str] = []

    def wait_stream(self, other: FakeStream) -> None:
        self.waited.append(other.name)


class FakeCuda:
    """What CudaGraphs calls of torch.cuda: one thread's current stream, a capture whose end
    fails as torch's does (``torch.cuda.graph`` then leaves the side stream current)."""

    def __init__(self) -> None:
        self.caller = self.current = FakeStream("caller")

    def current_stream(self, device: Any = None) -> FakeStream:
        return self.current

    def set_stream(self, stream: FakeStream) -> None:
        self.current = stream

    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    @contextlib.contextmanager
    def graph(self, graph: Any, stream: FakeStream, capture_error_mode: str) -> Iterator[None]:
        before, self.current = self.current, stream
        yield
        raise RuntimeError("operation failed due to a previous error during capture")
        self.current = before  # what capture_end skips when it raises

    def synchronize(self, device: Any = None) -> None:
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    cuda = FakeCuda()
    for name in ("current_stream", "set_stream", "stream", "graph", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    return cuda


def test_a_failed_cuda_capture_raises_its_own_error_on_the_caller_s_stream(
    fake_cuda: FakeCuda,
) -> None:
    backend = seam.CudaGraphs(torch.device("cuda", 0))
    with pytest.raises(RuntimeError, match="during capture"):
        backend.capture(lambda: None, lambda: ())
    assert fake_cuda.current is fake_cuda.caller and backend.captures == 0


def test_a_failed_warm_up_step_leaves_the_caller_s_stream_waiting_for_it(
    fake_cuda: FakeCuda,
) -> None:
    backend = seam.CudaGraphs(torch.device("cuda", 0))
    with pytest.raises(ValueError, match="the step"), backend.warming():
        assert fake_cuda.current is backend.stream
        raise ValueError("the step")
    assert fake_cuda.current is fake_cuda.caller and fake_cuda.caller.waited == ["side"]
