"""Hugging Face BERT and GPT-2 pipelined under poprun: 2 instances, each a replica of 2 devices.

Each instance trains a tiny ``BertForMaskedLM`` (``return_dict=True``) and a tiny
``GPT2LMHeadModel`` (``return_dict=False``), called with keyword inputs, pipelined with
``BeginBlock`` (tied word embedding and LM head on device 0), for a few steps on its half of
every batch. Both instances must end with the weights of the same model trained by plain
torch on the combined batch.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.support.jobs import ROOT, poprun_argv, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.slow]

pytest.importorskip("transformers")

STEPS, GA, MICRO, INSTANCES = 2, 3, 2, 2

CHILD = """
import sys
import torch
import popdist
import popdist.poptorch
import popdist_torch as poptorch
from tests.support.tiny_models import pipeline, tiny_bert, tiny_gpt2, token_batch

steps, ga, micro, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
instance = popdist.getInstanceIndex()
for name, build, return_dict in (("bert", tiny_bert, True), ("gpt2", tiny_gpt2, False)):
    model = build(2)
    opts = popdist.poptorch.Options()
    opts.Training.gradientAccumulation(ga)
    opts.setExecutionStrategy(pipeline(model, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    training = poptorch.trainingModel(model, opts, optimizer)
    for step in range(steps):
        batch = token_batch(micro * ga, seed=1000 * step + instance)
        training(**batch, return_dict=return_dict)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    torch.save(model.state_dict(), f"{out}/{name}{instance}.pt")
"""


def reference(build: str) -> dict[str, torch.Tensor]:
    from tests.support.tiny_models import tiny_bert, tiny_gpt2, token_batch

    model = (tiny_bert if build == "bert" else tiny_gpt2)(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        halves = [token_batch(MICRO * GA, seed=1000 * step + i) for i in range(INSTANCES)]
        combined = {k: torch.cat([h[k] for h in halves]) for k in halves[0]}
        optimizer.zero_grad()
        model(**combined).loss.backward()
        optimizer.step()
    return model.state_dict()


@pytest.mark.timeout(300)
def test_poprun_trains_pipelined_bert_and_gpt2_as_plain_torch(tmp_path: Path) -> None:
    (tmp_path / "child.py").write_text(textwrap.dedent(CHILD))
    argv = poprun_argv("--num-replicas", "2", "--num-instances", "2", "--ipus-per-replica", "2")
    argv += [sys.executable, str(tmp_path / "child.py"), str(STEPS), str(GA), str(MICRO)]
    done = run_job([*argv, str(tmp_path)], timeout=280)
    assert done.returncode == 0, done.stdout[-3000:]
    for build in ("bert", "gpt2"):
        got = [torch.load(tmp_path / f"{build}{i}.pt") for i in range(INSTANCES)]
        for name, value in reference(build).items():
            assert torch.equal(got[0][name], got[1][name]), (build, name)
            torch.testing.assert_close(got[0][name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert str(ROOT)  # the children import tests.support from the checkout (PYTHONPATH)
