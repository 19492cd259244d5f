"""Pipelined replicas trained data-parallel: 2 instances x 1 replica x 2 devices under mpirun.

Each instance reads its run from the environment contract (as poprun exports it),
pipelines its replica over ``num_ipus_per_replica`` CPU workers with ``StageRunner``,
sums gradients over instances with the collective backend (Horovod, then torch) and
steps SGD.  Both instances must end
with identical weights, equal to a single-process sequential loop over the global batch.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from popdist.env import instance_environment
from tests.support.jobs import ROOT, job_env, run_job

pytestmark = pytest.mark.parallel

STEPS, GA, MICRO, INSTANCES, DEVICES = 3, 4, 3, 2, 2

MODEL = """
import torch
from torch import nn
from popdist_torch.pipeline import BeginBlock

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = BeginBlock(nn.Linear(6, 12), "B1", ipu_id=0)
        self.act = nn.Tanh()
        self.b = BeginBlock(nn.Linear(12, 3), "B2", ipu_id=1)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, y):
        out = self.b(self.act(self.a(x)))
        return out, self.loss(out, y)

def make():
    torch.manual_seed(0)
    return Net()

def data(step, instance, ga, micro):
    gen = torch.Generator().manual_seed(1000 * step + instance)
    return [(torch.randn(micro, 6, generator=gen), torch.randint(0, 3, (micro,), generator=gen))
            for _ in range(ga)]
"""

CHILD = """
import sys
import torch
import popdist
from popdist.env import read_run
from popdist_torch.pipeline import PipelinedExecution, StageRunner
from pipemodel import make, data

steps, ga, micro, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
run = read_run()
popdist.init()
collectives = popdist.collectives.for_run()
assert collectives.size() == run.num_instances and collectives.rank() == run.instance_index
model = make()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
runner = StageRunner(model, PipelinedExecution("B1", "B2"), num_devices=run.num_ipus_per_replica)
for step in range(steps):
    optimizer.zero_grad()
    runner.forward_backward(data(step, run.instance_index, ga, micro), 1.0 / (ga * run.num_instances))
    for name, p in model.named_parameters():
        collectives.allreduce_(p.grad, name=name)
    optimizer.step()
assert len(runner.plan(2).stages) == 2 and runner.devices == [torch.device("cpu")] * 2
torch.save(model.state_dict(), f"{out}/weights{run.instance_index}.pt")
"""


def reference(tmp_path: Path) -> dict[str, torch.Tensor]:
    sys.path.insert(0, str(tmp_path))
    try:
        import pipemodel  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    model: nn.Module = pipemodel.make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        optimizer.zero_grad()
        for instance in range(INSTANCES):
            for x, y in pipemodel.data(step, instance, GA, MICRO):
                (model(x, y)[1] / (GA * INSTANCES)).backward()
        optimizer.step()
    return model.state_dict()


@pytest.mark.timeout(180)
def test_two_pipelined_replicas_train_like_one_process(backend: str, tmp_path: Path) -> None:
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    (tmp_path / "pipemodel.py").write_text(textwrap.dedent(MODEL))
    (tmp_path / "child.py").write_text(textwrap.dedent(CHILD))
    argv = ["mpirun", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    for index in range(INSTANCES):
        env = instance_environment(
            num_total_replicas=INSTANCES,
            num_ipus_per_replica=DEVICES,
            num_instances=INSTANCES,
            instance_index=index,
            local_instance_index=index,
            num_local_instances=INSTANCES,
            host="localhost",
        )
        if index:
            argv.append(":")
        argv += ["-np", "1"]
        for var, setting in {**env, "POPDIST_BACKEND": backend}.items():
            argv += ["-x", f"{var}={setting}"]
        argv += ["-x", "PYTHONPATH", sys.executable, str(tmp_path / "child.py")]
        argv += [str(STEPS), str(GA), str(MICRO), str(tmp_path)]
    done = run_job(argv, env=job_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}"), timeout=150)
    assert done.returncode == 0, done.stdout[-3000:]
    got = [torch.load(tmp_path / f"weights{i}.pt") for i in range(INSTANCES)]
    expected = reference(tmp_path)
    for name, value in expected.items():
        assert torch.equal(got[0][name], got[1][name]), name
        torch.testing.assert_close(got[0][name], value, rtol=1e-5, atol=1e-7, msg=name)
    assert not torch.equal(expected["a.weight"], reference_initial(tmp_path)["a.weight"])


EXECUTOR_CHILD = """
import sys
sys.path[:0] = sys.argv[5:7]
import torch
import popdist
import popdist.poptorch
import popdist_torch as poptorch
from popdist_torch.pipeline import PipelinedExecution
from pipemodel import make, data

steps, ga, micro, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
opts = popdist.poptorch.Options()
assert opts.ipus_per_replica == 2 and opts.replication_factor == 1
opts.Training.gradientAccumulation(ga)
opts.setExecutionStrategy(PipelinedExecution("B1", "B2"))
model = make()
training_model = poptorch.trainingModel(model, opts, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
instance = popdist.getInstanceIndex()
for step in range(steps):
    mbs = data(step, instance, ga, micro)
    training_model(torch.cat([x for x, _ in mbs]), torch.cat([y for _, y in mbs]))
torch.save(model.state_dict(), f"{out}/weights{instance}.pt")
"""


@pytest.mark.timeout(180)
def test_poprun_two_pipelined_replicas_through_the_executor(backend: str, tmp_path: Path) -> None:
    """``poprun --num-replicas 2 --num-instances 2 --ipus-per-replica 2`` with trainingModel."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed")
    (tmp_path / "pipemodel.py").write_text(textwrap.dedent(MODEL))
    (tmp_path / "child.py").write_text(textwrap.dedent(EXECUTOR_CHILD))
    argv = [sys.executable, "-m", "poprun", "--num-replicas", "2", "--num-instances", "2"]
    argv += [
        "--backend",
        backend,
        "--ipus-per-replica",
        str(DEVICES),
        sys.executable,
        str(tmp_path / "child.py"),
    ]
    argv += [str(STEPS), str(GA), str(MICRO), str(tmp_path), str(tmp_path), str(ROOT)]
    done = run_job(argv, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:]
    got = [torch.load(tmp_path / f"weights{i}.pt") for i in range(INSTANCES)]
    for name, value in reference(tmp_path).items():
        assert torch.equal(got[0][name], got[1][name]), name
        torch.testing.assert_close(got[0][name], value, rtol=1e-5, atol=1e-7, msg=name)


def reference_initial(tmp_path: Path) -> dict[str, torch.Tensor]:
    sys.path.insert(0, str(tmp_path))
    try:
        import pipemodel
    finally:
        sys.path.remove(str(tmp_path))
    return pipemodel.make().state_dict()
