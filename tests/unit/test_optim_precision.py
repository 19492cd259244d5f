"""PopTorch's optimizer arguments as PopTorch defines them (issue 25): float32 state for half
models, the accumulator types, loss scaling through the executor, RMSprop's TensorFlow
variant and LAMB."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

import popdist_torch as poptorch
from popdist_torch import optim

pytestmark = pytest.mark.unit


def model(dtype: torch.dtype = torch.float32) -> torch.nn.Sequential:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return net.to(dtype)


def backward(net: torch.nn.Module, seed: int = 1, factor: float = 10.0) -> None:
    gen = torch.Generator().manual_seed(seed)
    dtype = next(net.parameters()).dtype
    x = torch.randn(16, 4, generator=gen).to(dtype)
    y = torch.randn(16, 2, generator=gen).to(dtype)
    net.zero_grad()
    torch.nn.functional.mse_loss(net(x), y).mul(factor).backward()  # type: ignore[no-untyped-call]


def first_weight(net: torch.nn.Module) -> torch.Tensor:
    return next(net.parameters())


def grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None
    return p.grad


def test_half_model_keeps_float32_state_and_a_float32_update() -> None:
    """One step on a half model = torch's AdamW on a float32 copy, rounded to half."""
    half = model(torch.float16)
    opt = optim.AdamW(half.parameters(), lr=0.01)
    reference = [p.detach().float().requires_grad_() for p in half.parameters()]
    ref_opt = torch.optim.AdamW(reference, lr=0.01)
    for step in range(3):
        backward(half, seed=step)
        for p, r in zip(half.parameters(), reference, strict=True):
            r.data.copy_(p.detach().float())  # the reference restarts from the rounded weights
            r.grad = grad(p).float()
        opt.step()
        ref_opt.step()
        for p, r in zip(half.parameters(), reference, strict=True):
            assert p.dtype == torch.float16
            assert torch.equal(p, r.detach().half())
    for p in half.parameters():
        state = opt.state[p]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert len(opt.state_dict()["state"]) == 4


def test_torch_adamw_in_half_loses_its_second_moment() -> None:
    """Why the float32 state matters: torch's own AdamW on a half model divides by zero."""
    half = model(torch.float16)
    with torch.no_grad():
        first_weight(half)[0, 0] = 1.0
    backward(half, factor=1e-4)  # small gradients: their squares underflow in float16
    theirs, ours = copy.deepcopy(half), copy.deepcopy(half)
    for p, q in zip(half.parameters(), theirs.parameters(), strict=True):
        q.grad = grad(p).clone()
    for p, q in zip(half.parameters(), ours.parameters(), strict=True):
        q.grad = grad(p).clone()
    torch.optim.AdamW(theirs.parameters(), lr=1e-3).step()
    optim.AdamW(ours.parameters(), lr=1e-3).step()
    moved = [
        (q - p).abs().max().item()
        for p, q in zip(half.parameters(), ours.parameters(), strict=True)
    ]
    assert max(moved) < 0.01  # Adam's first step moves each weight by about lr
    jumped = [
        (q - p).abs().max().item()
        for p, q in zip(half.parameters(), theirs.parameters(), strict=True)
    ]
    assert max(jumped) > 0.01 or any(math.isnan(j) for j in jumped)


@pytest.mark.parametrize(
    ("cls", "kwargs", "types"),
    [
        (
            optim.Adam,
            {"first_order_momentum_accum_type": torch.float16},
            {"exp_avg": torch.float16, "exp_avg_sq": torch.float32},
        ),
        (
            optim.AdamW,
            {"second_order_momentum_accum_type": torch.float16, "amsgrad": True},
            {
                "exp_avg": torch.float32,
                "exp_avg_sq": torch.float16,
                "max_exp_avg_sq": torch.float16,
            },
        ),
        (
            optim.SGD,
            {"momentum": 0.9, "velocity_accum_type": torch.float16},
            {"momentum_buffer": torch.float16},
        ),
        (
            optim.RMSprop,
            {"momentum": 0.5, "centered": True, "second_order_momentum_accum_type": torch.float16},
            {
                "momentum_buffer": torch.float32,
                "grad_avg": torch.float32,
                "square_avg": torch.float16,
            },
        ),
        (
            optim.LAMB,
            {"first_order_momentum_accum_type": torch.float16},
            {"exp_avg": torch.float16, "exp_avg_sq": torch.float32},
        ),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_state_is_stored_in_the_types_the_arguments_name(
    cls: Any, kwargs: dict[str, Any], types: dict[str, torch.dtype], dtype: torch.dtype
) -> None:
    net = model(dtype)
    opt = cls(net.parameters(), lr=0.01, **kwargs)
    for step in range(2):
        backward(net, seed=step)
        opt.step()
    for p in net.parameters():
        assert p.dtype == dtype
        assert {k: v.dtype for k, v in opt.state[p].items() if k in types} == types
        assert all(torch.isfinite(v).all() for v in opt.state[p].values() if torch.is_tensor(v))


def test_state_loaded_into_a_half_model_is_float32_again_after_a_step() -> None:
    net = model(torch.float16)
    opt = optim.Adam(net.parameters(), lr=0.01)
    backward(net)
    opt.step()
    clone = optim.Adam(net.parameters(), lr=0.01)
    clone.load_state_dict(opt.state_dict())  # torch casts the state to the parameters' type
    backward(net, seed=2)
    clone.step()
    assert all(clone.state[p]["exp_avg"].dtype == torch.float32 for p in net.parameters())


def test_accum_type_values() -> None:
    assert optim.SGD(model().parameters(), accum_type=torch.float16).accum_type == torch.float16
    assert optim.Adam(model().parameters()).second_order_momentum_accum_type == torch.float32
    with pytest.raises(ValueError, match=r"accum_type=torch.float64 is invalid.*torch.float16"):
        optim.Adam(model().parameters(), accum_type=torch.float64)


def test_loss_scaling_attribute_reads_and_sets_every_group() -> None:
    net = model()
    opt = optim.SGD(
        [{"params": net[0].parameters()}, {"params": net[2].parameters()}], lr=0.1, loss_scaling=8
    )
    assert opt.loss_scaling == 8.0
    opt.loss_scaling = 64
    assert [g["loss_scaling"] for g in opt.param_groups] == [64.0, 64.0]
    assert optim.loss_scaling_of(opt) == 64.0
    assert optim.loss_scaling_of(torch.optim.SGD(net.parameters(), lr=0.1)) == 1.0
    with pytest.raises(ValueError, match="loss_scaling=-1 is invalid"):
        opt.loss_scaling = -1


class Regression(torch.nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.net = model(dtype)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.net(x)
        return out, torch.nn.functional.mse_loss(out, y)


def _data(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return torch.randn(8, 4, generator=gen).to(dtype), torch.randn(8, 2, generator=gen).to(dtype)


def test_loss_scaling_through_the_executor_gives_the_unscaled_update() -> None:
    """A power-of-two loss scale is exact in float32: the same weights bit for bit."""
    weights = []
    for factor in (1.0, 128.0):
        net = Regression()
        opts = poptorch.Options().replicationFactor(2)
        opts.Training.gradientAccumulation(2)
        opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9, loss_scaling=factor)
        trained = poptorch.trainingModel(net, opts, opt)
        for _ in range(3):
            _, loss = trained(*_data())
        assert float(loss.mean()) < 10  # outputs carry the unscaled loss
        weights.append([p.detach().clone() for p in net.parameters()])
        grads = [p.grad for p in net.parameters()]
        assert all(g is not None and g.abs().max() < 10 for g in grads)  # unscaled after step
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def test_loss_scaling_keeps_small_float16_gradients_from_flushing_to_zero() -> None:
    """Gradients of 1e-8 are zero in float16; scaled by 2**14 they survive and are unscaled
    into the float32 velocity."""

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (self.w * x).sum() * 1e-8

    velocities = {}
    for factor in (1.0, 16384.0):
        net = Tiny()
        opt = optim.SGD(net.parameters(), lr=0.0, momentum=0.9, loss_scaling=factor)
        poptorch.trainingModel(net, poptorch.Options(), opt)(torch.ones(1, 4, dtype=torch.float16))
        velocities[factor] = opt.state[net.w]["momentum_buffer"]
    assert velocities[1.0].abs().max() == 0
    torch.testing.assert_close(velocities[16384.0], torch.full((4,), 1e-8), rtol=1e-2, atol=0)
    assert velocities[16384.0].dtype == torch.float32


def test_rmsprop_tensorflow_variant() -> None:
    """Mean square from one, eps inside the root, the learning rate in the momentum buffer."""
    lr, alpha, eps, momentum = 0.01, 0.9, 1e-3, 0.5
    net = model()
    start = [p.detach().double().clone() for p in net.parameters()]
    opt = optim.RMSprop(
        net.parameters(), lr=lr, alpha=alpha, eps=eps, momentum=momentum, use_tf_variant=True
    )
    grads = []
    for step in range(3):
        backward(net, seed=step)
        grads.append([grad(p).double().clone() for p in net.parameters()])
        opt.step()
    for i, p in enumerate(net.parameters()):
        w, square, buf = start[i], torch.ones_like(start[i]), torch.zeros_like(start[i])
        for g in (grads[step][i] for step in range(3)):
            square = alpha * square + (1 - alpha) * g * g
            buf = momentum * buf + lr * g / (square + eps).sqrt()
            w = w - buf
        torch.testing.assert_close(p.double(), w, rtol=1e-5, atol=1e-6)
    plain = model()
    popt = optim.RMSprop(plain.parameters(), lr=lr, alpha=alpha, eps=eps, momentum=momentum)
    for step in range(3):
        backward(plain, seed=step)
        popt.step()
    assert not torch.equal(first_weight(plain), first_weight(net))


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("max_weight_norm", [None, 0.5])
def test_lamb_matches_its_definition(bias_correction: bool, max_weight_norm: float | None) -> None:
    lr, (b1, b2), eps, wd = 0.01, (0.9, 0.999), 1e-6, 0.01
    net = model()
    start = [p.detach().double().clone() for p in net.parameters()]
    opt = optim.LAMB(
        net.parameters(),
        lr=lr,
        eps=eps,
        weight_decay=wd,
        bias_correction=bias_correction,
        max_weight_norm=max_weight_norm,
    )
    grads = []
    for step in range(3):
        backward(net, seed=step)
        grads.append([grad(p).double().clone() for p in net.parameters()])
        opt.step()
    limit = 65500.0 if max_weight_norm is None else max_weight_norm
    for i, p in enumerate(net.parameters()):
        w, m, v = start[i], torch.zeros_like(start[i]), torch.zeros_like(start[i])
        for t in range(1, 4):
            g = grads[t - 1][i]
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            c1, c2 = (1 - b1**t, 1 - b2**t) if bias_correction else (1.0, 1.0)
            u = (m / c1) / ((v / c2).sqrt() + eps) + wd * w
            r1, r2 = min(float(w.norm()), limit), float(u.norm())
            w = w - lr * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0) * u
        torch.testing.assert_close(p.double(), w, rtol=1e-5, atol=1e-6)


def test_lamb_arguments() -> None:
    opt = optim.LAMB(model().parameters())
    assert (opt.max_weight_norm, opt.bias_correction, opt.loss_scaling) == (65500.0, True, 1.0)
    assert opt.param_groups[0]["weight_decay"] == 1e-2
    with pytest.raises(ValueError, match="max_weight_norm=-1 is invalid"):
        optim.LAMB(model().parameters(), max_weight_norm=-1)
