"""``torch.ops.poptorch.*`` and PopTorch's in-model helpers in eager, traced and scripted models.

PopTorch programs mark graphs from inside ``forward`` (name scopes, blocks, available memory,
recomputation checkpoints, prints); each test here would fail if the operators were not
registered with torch, or if they changed the numbers, broke autograd, tracing, scripting,
or the executor's ``vmap`` over local replicas.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import popdist_torch as poptorch
from popdist_torch.options import UnsupportedOptionError
from popdist_torch.surface import NO_OP, REFUSED, rows_of
from popdist_torch.surface.graph_ops import NAMESPACE, SCHEMAS, register

pytestmark = [
    pytest.mark.unit,
    pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:DeprecationWarning"),
]

OPS = torch.ops.poptorch


def test_every_operator_row_is_registered_with_its_schema() -> None:
    names = [row.name for row in rows_of(NAMESPACE)]
    assert sorted(names) == sorted(SCHEMAS)
    assert register() is True  # registered at import, once; a second call changes nothing
    for name in names:
        assert str(getattr(OPS, name).default._schema) == f"poptorch::{SCHEMAS[name]}", name


def test_hints_return_their_tensor_and_markers_nothing() -> None:
    x = torch.randn(4, 3)
    assert OPS.nop(x) is x
    assert OPS.set_available_memory(x, 0.2) is x
    assert OPS.recomputation_checkpoint(x) is x
    assert OPS.set_matmul_serialization(x, "output_channels", 2, False) is x
    assert OPS.set_matmul_serialization(x, "reducing_dim") is x  # PopTorch 2's arguments
    assert OPS.set_overlap_for_input(x, "overlap_accumulation_loop") is x
    assert OPS.set_overlap_for_output(x, "no_overlap") is x
    markers: list[Any] = [
        OPS.begin_ipu_block(1, 0, 1),
        OPS.end_ipu_block(),
        OPS.push_name_scope("encoder"),
        OPS.pop_name_scope(),
        OPS.set_attribute("__outline", "layer", "embedding"),
        OPS.clear_attribute("__outline", "layer"),
        OPS.optimizer_group(0, [x]),
        OPS.begin_multi_conv(),
        OPS.end_multi_conv([0.3, 0.3], None, 0, None, None, None),
        OPS.end_multi_conv(),
    ]
    assert markers == [None] * len(markers)


def test_computing_operators_compute() -> None:
    x = torch.arange(12.0).reshape(3, 4)
    torch.testing.assert_close(OPS.identity_loss(x, 0), x.sum())
    torch.testing.assert_close(OPS.identity_loss(x, 1), x.mean())
    torch.testing.assert_close(OPS.identity_loss(x, 2), x)
    with pytest.raises(ValueError, match="reduction=7"):
        OPS.identity_loss(x, 7)
    torch.testing.assert_close(OPS.dynamic_slice(x, 1, torch.tensor(1), 2, 1), x[:, 1:3])
    updated = OPS.dynamic_update(x, torch.zeros(3, 2), 1, torch.tensor(2), 2)
    assert updated[:, 2:].sum() == 0 and x[0, 2] == 2


def test_refused_operators_raise_their_rows_reason() -> None:
    t = torch.ones(2)
    calls = {
        "start_for_loop": lambda: OPS.start_for_loop([t]),
        "end_for_loop": lambda: OPS.end_for_loop([t], [t], 3),
        "start_if_block": lambda: OPS.start_if_block(t),
        "start_else_block": lambda: OPS.start_else_block([t]),
        "end_if_block": lambda: OPS.end_if_block([t], t),
        "call_cpu_op": lambda: OPS.call_cpu_op([t], "cpu"),
        "end_cpu_op": lambda: OPS.end_cpu_op([t]),
        "custom_operation": lambda: OPS.custom_operation([t], "Cube", "acme", 1, 1, [t], ""),
        "ctc_beam_search_decoder": lambda: OPS.ctc_beam_search_decoder(t, t, 0, 2, 1),
        "fps": lambda: OPS.fps(t, [0, 2], 0.5, False),
        "nearest": lambda: OPS.nearest(t, t, t, t),
        "nearest_batch_list": lambda: OPS.nearest_batch_list(t, t, [0], [0]),
    }
    refused = {row.name: row for row in rows_of(NAMESPACE) if row.status == REFUSED}
    assert sorted(calls) == sorted(refused)
    for name, call in calls.items():
        with pytest.raises(UnsupportedOptionError) as caught:
            call()
        assert str(caught.value) == refused[name].message()
    assert "poptorch.for_loop" in refused["end_for_loop"].note


def test_ipu_print_tensor_prints_and_returns(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.tensor([1.5, 2.5])
    assert OPS.ipu_print_tensor(x, "acts: ") is x
    assert poptorch.ipu_print_tensor(x, "again: ", False, 10, 2, 60, 3, "fixed") is x
    out = capsys.readouterr().out
    assert "acts: tensor([1.5000, 2.5000])" in out and "again: tensor(" in out


class MarkedNet(nn.Module):
    """A PopTorch-style model: every graph-level marker of a PopTorch program, in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.ops.poptorch.push_name_scope("features")
        torch.ops.poptorch.begin_ipu_block(0, 0, 0)
        torch.ops.poptorch.begin_multi_conv()
        h = torch.relu(self.conv(x))
        torch.ops.poptorch.end_multi_conv(None, None, None, None, None, None)
        h = torch.ops.poptorch.set_available_memory(h, 0.3)
        h = torch.ops.poptorch.recomputation_checkpoint(h)
        torch.ops.poptorch.end_ipu_block()
        torch.ops.poptorch.pop_name_scope()
        h = torch.ops.poptorch.nop(h.flatten(1))
        out = torch.ops.poptorch.set_matmul_serialization(self.fc(h), "output_channels", 1, False)
        return out


class PlainNet(MarkedNet):
    """The same model without the markers: the numbers the marked one must give."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class HelperNet(MarkedNet):
    """The same model through PopTorch's Python helpers (``poptorch.nop``...)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        h = poptorch.set_available_memory(h, 0.3)
        h = poptorch.recomputationCheckpoint(h)
        h = poptorch.ipu_print_tensor(poptorch.nop(h.flatten(1)), "h")
        return self.fc(h)


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    model(x).square().sum().backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("compile_with", ["eager", "trace", "script"])
@pytest.mark.parametrize("cls", [MarkedNet, HelperNet])
def test_marked_models_compute_and_learn_as_plain_ones(
    cls: type[MarkedNet], compile_with: str, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    marked, x = cls(), torch.randn(5, 2, 6)
    plain = PlainNet()
    plain.load_state_dict(marked.state_dict())
    model: Any = marked
    if compile_with == "trace":
        model = torch.jit.trace(marked, x)
    elif compile_with == "script":
        model = torch.jit.script(marked)
    if compile_with != "eager" and cls is MarkedNet:
        graph = str(model.graph if compile_with == "script" else model.inlined_graph)
        assert "poptorch::set_available_memory" in graph and "poptorch::nop" in graph
    torch.testing.assert_close(model(x), plain(x))
    for got, want in zip(_grads(model, x), _grads(plain, x), strict=True):
        torch.testing.assert_close(got, want)
    if cls is HelperNet:
        assert "htensor(" in capsys.readouterr().out  # the scripted model prints too


def test_context_helpers_trace() -> None:
    class Scoped(PlainNet):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with (
                poptorch.Attribute(__outline={"layer": "features"}),
                poptorch.NameScope("features"),
                poptorch.MultiConv().availableMemoryProportions(0.2).partialsTypes(torch.float16),
            ):
                h = torch.relu(self.conv(x))
            return self.fc(h.flatten(1))

    torch.manual_seed(0)
    model, x = Scoped(), torch.randn(3, 2, 6)
    torch.testing.assert_close(torch.jit.trace(model, x)(x), PlainNet.forward(model, x))


def test_the_executor_fuses_replicas_over_the_operators() -> None:
    """Two local replicas of a marked model run as one ``vmap`` and learn as the plain twin."""
    torch.manual_seed(0)
    marked = MarkedNet()
    plain = PlainNet()
    plain.load_state_dict(copy.deepcopy(marked.state_dict()))
    x, y = torch.randn(8, 2, 6), torch.randint(0, 3, (8,))

    class WithLoss(nn.Module):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
            out = self.net(x)
            loss = torch.ops.poptorch.identity_loss(nn.functional.cross_entropy(out, y), 2)
            return out, loss

    results = []
    for net in (marked, plain):
        model = WithLoss(net)
        opts = poptorch.Options().replicationFactor(2)
        training = poptorch.trainingModel(
            model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)
        )
        for _ in range(3):
            training(x, y)
        assert training.replica_runner.fused is True
        results.append([p.detach().clone() for p in net.parameters()])
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)


def test_ipu_print_tensor_prints_the_gradient_in_backward(
    capsys: pytest.CaptureFixture[str],
) -> None:
    x = torch.ones(2, requires_grad=True)
    (poptorch.ipu_print_tensor(x * 3, "a") * 2).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [6.0, 6.0]
    out = capsys.readouterr().out
    assert "a_gradienttensor([2., 2.])" in out
    poptorch.ipu_print_tensor(x * 3, "b", False).sum().backward()
    assert "b_gradient" not in capsys.readouterr().out


def test_print_inside_the_replicas_vmap_shows_values(capsys: pytest.CaptureFixture[str]) -> None:
    printed = torch.func.vmap(lambda t: OPS.ipu_print_tensor(t * 2, "v"))(torch.ones(2, 3))
    assert printed.shape == (2, 3)
    out = capsys.readouterr().out
    assert "vtensor([[2., 2., 2.]," in out and "Batched" not in out


def test_no_op_rows_say_why() -> None:
    for row in rows_of(NAMESPACE):
        if row.status == NO_OP:
            assert row.note, row.name
