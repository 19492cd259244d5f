"""Real models through the pipeline, in one process: Hugging Face BERT and GPT-2, ViT, CLIP.

Each is pipelined with ``BeginBlock`` as Graphcore's applications did (the tied word
embedding and LM head together on device 0), trained with ``trainingModel`` and compared
with the same model trained by plain torch.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import popdist_torch as poptorch
from popdist_torch.pipeline import PipelinedExecution, record_schedule
from tests.support.tiny_models import CLIPLike, ViTLike, pipeline, tiny_bert, tiny_gpt2, token_batch

pytestmark = [pytest.mark.unit, pytest.mark.slow]

pytest.importorskip("transformers")

MICRO, STEPS = 2, 2


def train_pipelined(model: nn.Module, devices: int, return_dict: bool, ga: int) -> list[Any]:
    strategy = pipeline(model, devices)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(ga)
    opts.setExecutionStrategy(strategy)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.5))
    outs = []
    for step in range(STEPS):
        outs.append(training(**token_batch(MICRO * ga, seed=step), return_dict=return_dict))
    return outs


def train_plain(model: nn.Module, ga: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(STEPS):
        optimizer.zero_grad()
        model(**token_batch(MICRO * ga, seed=step)).loss.backward()
        optimizer.step()


@pytest.mark.parametrize("return_dict", [True, False], ids=["return_dict", "tuple"])
@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("build", [tiny_bert, tiny_gpt2], ids=["bert", "gpt2"])
def test_hugging_face_lm_pipelined_trains_as_plain_torch(
    build: Any, devices: int, return_dict: bool
) -> None:
    layers, ga = (2, 3) if devices == 2 else (4, 5)  # as many micro-batches as stages
    reference, model = build(layers), build(layers)
    train_plain(reference, ga)
    with record_schedule() as events:
        outs = train_pipelined(model, devices, return_dict, ga)
    # the tie survives
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    stages = 3 if devices == 2 else 5
    assert {e.stage for e in events} == set(range(stages))
    assert {e.device for e in events} == set(range(devices))
    for (name, p), q in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)
    loss = outs[-1]["loss"] if return_dict else outs[-1][0]
    assert loss.shape == () and torch.isfinite(loss)  # OutputMode.Final: the last micro-batch
    logits = outs[-1]["logits"] if return_dict else outs[-1][1]
    assert logits.shape == (MICRO, 8, 100)
    if devices == 2:  # the same stages for inference, keyword inputs, every micro-batch out
        opts = poptorch.Options().deviceIterations(2)
        opts.setExecutionStrategy(pipeline(model, devices))
        inference = poptorch.inferenceModel(model.eval(), opts)
        batch = token_batch(4, seed=7)
        del batch["labels"]
        with torch.no_grad():
            expected = model(**batch).logits
        got = inference(**batch, return_dict=return_dict)
        got = got["logits"] if return_dict else got[0]
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def micro_loop(model: nn.Module, batches: list[tuple[torch.Tensor, ...]], lr: float) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(STEPS):
        optimizer.zero_grad()
        for mb in batches[step * 4 : (step + 1) * 4]:
            out = model(*mb)
            loss = out["loss"] if isinstance(out, dict) else out[1]
            (loss / 4).backward()
        optimizer.step()


@pytest.mark.parametrize("build", [ViTLike, CLIPLike], ids=["vit", "clip"])
def test_vision_models_updating_buffers_pipelined_train_as_plain_torch(build: Any) -> None:
    """The reference runs the same micro-batches (CLIP's loss couples a batch's samples)."""
    torch.manual_seed(0)
    base = build()
    gen = torch.Generator().manual_seed(5)
    vit = build is ViTLike
    batches = [
        (
            torch.randn(MICRO, 3, 8, 8, generator=gen)
            if vit
            else torch.randn(MICRO, 3, 4, 4, generator=gen),
            torch.randint(0, 5, (MICRO,), generator=gen)
            if vit
            else torch.randint(0, 100, (MICRO, 6), generator=gen),
        )
        for _ in range(4 * STEPS)
    ]
    reference, model = copy.deepcopy(base), copy.deepcopy(base)
    micro_loop(reference, batches, lr=0.1)
    opts = poptorch.Options()
    opts.Training.gradientAccumulation(4)
    opts.setExecutionStrategy(PipelinedExecution())
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(STEPS):
        chunk = batches[step * 4 : (step + 1) * 4]
        training(*[torch.cat([mb[i] for mb in chunk]) for i in range(len(chunk[0]))])
    for (name, p), q in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)
    for (name, b), c in zip(reference.named_buffers(), model.buffers(), strict=True):
        torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6, msg=name)
    assert any(not torch.equal(b, c) for b, c in zip(base.buffers(), model.buffers(), strict=True))


@pytest.mark.parametrize("build", [tiny_bert, tiny_gpt2], ids=["bert", "gpt2"])
def test_hugging_face_lm_unstaged_takes_keywords_and_returns_its_model_output(build: Any) -> None:
    """Not pipelined: two local replicas, keyword inputs, the ModelOutput's 'loss' trained."""
    reference, model = build(2), build(2)
    train_plain(reference, 2)
    opts = poptorch.Options().replicationFactor(2)
    training = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.5))
    for step in range(STEPS):
        out = training(**token_batch(MICRO * 2, seed=step))
    from transformers.utils import ModelOutput

    assert isinstance(out, ModelOutput) and out.logits.shape == (MICRO * 2, 8, 100)
    for (name, p), q in zip(reference.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)
    inference = poptorch.inferenceModel(model.eval(), poptorch.Options())
    batch = token_batch(3, seed=9)
    with torch.no_grad():
        expected = model(**batch).logits
    torch.testing.assert_close(inference(**batch).logits, expected, rtol=1e-5, atol=1e-6)
