"""popdist_torch.optim against torch's own optimizers: identical updates, clear refusals."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

from popdist_torch import optim

pytestmark = pytest.mark.unit


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def train(
    net: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 5, clip: float | None = None
) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=gen)
        y = torch.randn(16, 2, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).mul(10).backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(net.parameters()), clip)
        opt.step()


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


Factory = Callable[..., torch.optim.Optimizer]
PAIRS: list[tuple[Factory, Factory, dict[str, Any], dict[str, Any]]] = [
    (
        optim.SGD,
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "nesterov": True},
        {"velocity_scaling": 4.0, "use_combined_accum": True, "velocity_accum_type": torch.float32},
    ),
    (
        optim.SGD,
        torch.optim.SGD,
        {"lr": 0.05, "weight_decay": 0.1, "dampening": 0.2, "momentum": 0.5},
        {},
    ),
    (
        optim.Adam,
        torch.optim.Adam,
        {"lr": 0.01, "amsgrad": True},
        {"first_order_momentum_accum_type": torch.float32},
    ),
    (
        optim.AdamW,
        torch.optim.AdamW,
        {"lr": 0.01, "weight_decay": 0.1},
        {"second_order_momentum_accum_type": torch.float32},
    ),
    (
        optim.RMSprop,
        torch.optim.RMSprop,
        {"lr": 0.01, "momentum": 0.5, "centered": True},
        {"use_tf_variant": False},
    ),
]


@pytest.mark.parametrize(("ours", "theirs", "args", "extras"), PAIRS)
def test_same_updates_as_torch(
    ours: Factory, theirs: Factory, args: dict[str, Any], extras: dict[str, Any]
) -> None:
    a, b = model(), model()
    opt_a = ours(a.parameters(), loss_scaling=128.0, accum_type=torch.float32, **args, **extras)
    opt_b = theirs(b.parameters(), **args)
    assert isinstance(opt_a, theirs)
    train(a, opt_a)
    train(b, opt_b)
    assert same_weights(a, b)
    assert opt_a.param_groups[0]["loss_scaling"] == 128.0


@pytest.mark.parametrize(("ours", "theirs", "args"), [(p[0], p[1], p[2]) for p in PAIRS])
def test_max_grad_norm_clips_like_torch(
    ours: Factory, theirs: Factory, args: dict[str, Any]
) -> None:
    a, b = model(), model()
    train(a, ours(a.parameters(), max_grad_norm=0.05, **args))
    train(b, theirs(b.parameters(), **args), clip=0.05)
    assert same_weights(a, b)
    c = model()
    train(c, theirs(c.parameters(), **args))
    assert not same_weights(a, c)  # the clipping did something


def test_adamw_without_bias_correction() -> None:
    """Adam's moments without the 1/(1-beta^t) factors, decoupled weight decay."""
    net = model()
    reference = copy.deepcopy(net)
    lr, (b1, b2), eps, wd = 0.01, (0.9, 0.999), 1e-8, 0.1
    opt = optim.AdamW(
        net.parameters(), lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, bias_correction=False
    )
    train(net, opt, steps=3)

    params = [p.detach().clone().double() for p in reference.parameters()]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 2, generator=gen)
        for p, q in zip(reference.parameters(), params, strict=True):
            p.data.copy_(q)
        reference.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).mul(10).backward()
        for i, p in enumerate(reference.parameters()):
            g = p.grad.double()
            params[i] = params[i] * (1 - lr * wd)
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            params[i] = params[i] - lr * m[i] / (v[i].sqrt() + eps)
    for p, q in zip(net.parameters(), params, strict=True):
        torch.testing.assert_close(p.double(), q, rtol=1e-5, atol=1e-6)
    corrected = model()
    train(corrected, torch.optim.AdamW(corrected.parameters(), lr=lr, weight_decay=wd), steps=3)
    assert not same_weights(net, corrected)


def test_state_dict_round_trip() -> None:
    net = model()
    opt = optim.AdamW(net.parameters(), lr=0.01, bias_correction=False)
    train(net, opt, steps=2)
    clone = optim.AdamW(net.parameters(), lr=0.5)
    clone.load_state_dict(opt.state_dict())
    assert clone.param_groups[0]["bias_correction"] is False
    assert clone.param_groups[0]["lr"] == 0.01


def test_step_hooks_run_once() -> None:
    net = model()
    opt = optim.SGD(net.parameters(), lr=0.1)
    torch.optim.SGD(model().parameters(), lr=0.1)  # a torch SGD patches torch's step too
    calls: list[int] = []
    opt.register_step_pre_hook(lambda *_: calls.append(1))
    train(net, opt, steps=2)
    assert calls == [1, 1]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_scaling": 0}, r"loss_scaling=0 is invalid"),
        ({"loss_scaling": float("inf")}, r"loss_scaling=inf is invalid"),
        ({"max_grad_norm": -1.0}, r"max_grad_norm=-1.0 is invalid"),
        ({"accum_type": torch.bfloat16}, r"accum_type=torch.bfloat16 is invalid"),
    ],
)
def test_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        optim.Adam(model().parameters(), **kwargs)


def test_unsupported_options() -> None:
    with pytest.raises(ValueError, match=r"bias_correction=False\) does not support foreach"):
        optim.AdamW(model().parameters(), bias_correction=False, foreach=True)
