"""Where the executor computes: the device decision with fake GPU counts, and what it moves.

No GPU is needed: the decision is pure, and the moves are checked on torch's ``meta``
device standing in for the instance's GPU (``make gpu-check`` runs the real thing).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import popdist_torch as pt
from popdist_torch.execution import executor as executor_module
from popdist_torch.execution import placement
from popdist_torch.execution.batch import Batch
from popdist_torch.execution.placement import choose_device, to_host

pytestmark = pytest.mark.unit

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


def test_gradients_over_horovod_stay_on_the_cpu() -> None:
    """This Horovod build has no GPU collectives: across instances only the torch backend."""
    got = choose_device(
        device_count=1, current=0, offline=False, pipelined=False, collectives_on_gpu=False
    )
    assert got == placement.CPU


@pytest.mark.parametrize(
    ("count", "current", "offline", "pipelined", "expected"),
    [
        (0, 0, False, False, placement.CPU),  # no GPU
        (1, 0, False, False, CUDA0),  # poprun gave this instance one GPU
        (4, 0, False, False, CUDA0),  # ... or several: replicas run on the first
        (4, 1, False, False, CUDA1),  # plain mpirun: the backend chose local rank 1's
        (4, 9, False, False, CUDA0),  # a current index past the count: the first
        (2, 0, True, False, placement.CPU),  # --offline-mode
        (2, 0, False, True, placement.CPU),  # pipeline stages place themselves
    ],
)
def test_choose_device(
    count: int, current: int, offline: bool, pipelined: bool, expected: torch.device
) -> None:
    got = choose_device(device_count=count, current=current, offline=offline, pipelined=pipelined)
    assert got == expected


@pytest.mark.parametrize(
    ("backend", "processes", "expected"),
    [
        ("horovod", 2, placement.CPU),  # Horovod does not reduce CUDA tensors here
        ("torch", 2, CUDA0),  # NCCL does
        ("horovod", 1, CUDA0),  # one process: the local backend reduces nothing anywhere
    ],
)
def test_the_device_follows_the_backends_declared_capability(
    monkeypatch: pytest.MonkeyPatch, backend: str, processes: int, expected: torch.device
) -> None:
    from popdist import env

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.delenv(env.OFFLINE_MODE, raising=False)
    monkeypatch.setenv(env.BACKEND, backend)
    got = placement.instance_device(pipelined=False, num_processes=processes)
    assert got == expected


def test_this_cpu_only_machine_computes_on_the_cpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert placement.instance_device(pipelined=False) == placement.CPU


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.fc(x)
        return out, nn.functional.mse_loss(out, y)


META = torch.device("meta")


def test_wrapping_moves_model_and_existing_optimizer_state_to_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(4, 3), torch.zeros(4, 2))[1].backward()
    opt.step()  # state exists on the CPU, as after loading a checkpoint
    monkeypatch.setattr(executor_module, "instance_device", lambda pipelined, num_processes: META)
    wrapped = pt.trainingModel(model, pt.Options(), opt)
    assert wrapped._device == META
    assert {p.device for p in model.parameters()} == {META}
    # meta swaps the Parameter objects: the optimizer follows the module's new ones
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in model.parameters()]
    state = opt.state[model.fc.weight]
    assert state["exp_avg"].device == META and state["exp_avg_sq"].device == META
    assert state["step"].device == placement.CPU  # scalar step stays on the host


def test_every_batch_leaf_goes_to_the_device() -> None:
    opts = pt.Options().replicationFactor(2)
    x, y = torch.ones(4, 3), torch.zeros(4, 2)
    batch = Batch((x, y, 7), {}, opts, META)
    assert [t.device for t in batch.batched] == [META, META]
    assert [t.shape for t in batch.batched] == [(1, 1, 2, 2, 3), (1, 1, 2, 2, 2)]
    assert batch.constants[2] == 7


def test_cpu_batches_are_not_copied() -> None:
    x = torch.ones(4, 3)
    batch = Batch((x,), {}, pt.Options())
    assert batch.batched[0].data_ptr() == x.data_ptr()


def test_outputs_come_back_in_host_memory() -> None:
    tree = {"a": torch.ones(2, device=META), "b": (torch.zeros(1), 3)}
    moved = to_host({"b": tree["b"]})
    assert moved["b"][0].device == placement.CPU and moved["b"][1] == 3
    with pytest.raises(NotImplementedError):  # meta has no data: proves .cpu() was called
        to_host(tree)


def test_an_inference_model_of_the_same_module_shares_the_placed_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = Net()
    monkeypatch.setattr(executor_module, "instance_device", lambda pipelined, num_processes: META)
    training = pt.trainingModel(model)
    weight = model.fc.weight
    pt.inferenceModel(model)
    assert model.fc.weight is weight and weight.device == META
    opt = training.getOptimizer()
    assert opt is not None and opt.param_groups[0]["params"][0] is weight


# --- half precision -----------------------------------------------------------------------


def test_autocast_runs_forward_in_half_and_keeps_weights_in_float32() -> None:
    torch.manual_seed(0)
    model = Net()
    opts = pt.Options().replicationFactor(2)
    opts.Precision.autocastEnabled(True)
    assert opts.Precision.toDict() == {"autocast": True, "autocast_dtype": "bfloat16"}
    training = pt.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    before = model.fc.weight.detach().clone()
    out, _ = training(torch.randn(8, 3), torch.randn(8, 2))
    assert out.dtype == torch.bfloat16  # the Linear ran under autocast
    assert model.fc.weight.dtype == torch.float32 and not torch.equal(model.fc.weight, before)
    inference = pt.inferenceModel(model, opts)
    assert inference(torch.randn(4, 3), torch.randn(4, 2))[0].dtype == torch.bfloat16


def test_without_autocast_the_model_computes_in_float32() -> None:
    out, _ = pt.inferenceModel(Net())(torch.randn(4, 3), torch.randn(4, 2))
    assert out.dtype == torch.float32


def test_autocast_takes_float16_and_rejects_other_types() -> None:
    opts = pt.Options()
    opts.Precision.autocastEnabled(True, torch.float16)
    assert opts.Precision.autocast_dtype == "float16"
    with pytest.raises(ValueError, match=r"autocastEnabled\(dtype=torch.float64\)"):
        opts.Precision.autocastEnabled(True, torch.float64)
