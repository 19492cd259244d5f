"""Tiny real models for the pipeline tests: Hugging Face BERT and GPT-2, ViT- and CLIP-like.

Built locally from configurations (no hub: ``HF_HUB_OFFLINE=1``), hidden size 32, a vocab
of 100, dropout off so that runs compare exactly. :func:`pipeline` puts ``BeginBlock`` on
the embedding, every layer and the LM head as Graphcore's applications did: the embedding
and the head (which share the tied word embedding) on device 0, the layers spread over the
other devices, one stage per run of blocks on one device.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch import nn

from popdist_torch.pipeline import BeginBlock, PipelinedExecution, Stage

HIDDEN, VOCAB, SEQ = 32, 100, 8


def tiny_bert(layers: int = 4, seed: int = 0) -> nn.Module:
    """A ``BertForMaskedLM`` whose decoder weight is the word embedding (tied)."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * HIDDEN,
        max_position_embeddings=4 * SEQ,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForMaskedLM(config)


def tiny_gpt2(layers: int = 4, seed: int = 0) -> nn.Module:
    """A ``GPT2LMHeadModel`` whose ``lm_head`` weight is ``wte``'s (tied); no cache."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB,
        n_embd=HIDDEN,
        n_layer=layers,
        n_head=2,
        n_positions=4 * SEQ,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return GPT2LMHeadModel(config)


def hf_parts(model: nn.Module) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """The embedding, the layers and the LM head of a tiny BERT or GPT-2."""
    if hasattr(model, "bert"):
        return model.bert.embeddings, model.bert.encoder.layer, model.cls
    return model.transformer.wte, model.transformer.h, model.lm_head


def pipeline(model: nn.Module, devices: int) -> PipelinedExecution:
    """Mark the blocks of a tiny BERT or GPT-2 over ``devices`` devices; their strategy."""
    embedding, layers, head = hf_parts(model)
    placed = [("embedding", embedding, 0)]
    for i, layer in enumerate(layers):
        placed.append((f"layer{i}", layer, 1 + i * (devices - 1) // len(layers)))
    placed.append(("head", head, 0))
    stages: list[Stage] = []
    previous = None
    for name, module, ipu in placed:
        BeginBlock(module, name, ipu_id=ipu)
        if ipu == previous:
            stages[-1] = Stage(*stages[-1].blocks, name).ipu(ipu)
        else:
            stages.append(Stage(name).ipu(ipu))
        previous = ipu
    return PipelinedExecution(*stages)


def token_batch(samples: int, seed: int) -> dict[str, torch.Tensor]:
    """Keyword inputs of a language model: ids, an all-ones attention mask, labels."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (samples, SEQ), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


class _Encoder(nn.Module):
    """One pre-norm transformer layer."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.mlp = nn.Sequential(
            nn.Linear(HIDDEN, 2 * HIDDEN), nn.GELU(), nn.Linear(2 * HIDDEN, HIDDEN)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(-2, -1) / HIDDEN**0.5, dim=-1)
        x = x + self.proj(attention @ v)
        return x + self.mlp(self.norm2(x))


class ViTLike(nn.Module):
    """Patches, a class token, two encoder layers, a classifier; counts the images it saw."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.patches = BeginBlock(
            nn.Conv2d(3, HIDDEN, kernel_size=4, stride=4), "patches", ipu_id=0
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, HIDDEN))
        self.position = nn.Parameter(torch.randn(1, 5, HIDDEN) * 0.02)
        self.layers = nn.ModuleList(
            [BeginBlock(_Encoder(), f"layer{i}", ipu_id=1 + i) for i in range(2)]
        )
        self.head = nn.Linear(HIDDEN, classes)
        self.register_buffer("images_seen", torch.zeros((), dtype=torch.long))

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, Any]:
        self.images_seen += images.shape[0]  # a buffer updated in forward
        x = self.patches(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.position
        for layer in self.layers:
            x = layer(x)
        logits = self.head(x[:, 0])
        return logits, nn.functional.cross_entropy(logits, labels)


class CLIPLike(nn.Module):
    """An image and a text encoder, a learnt temperature, a symmetric contrastive loss.

    The text is pooled at each sequence's highest token id (CLIP's end-of-text pooling),
    and a running mean of the image features' norm is kept in a buffer.
    """

    def __init__(self) -> None:
        super().__init__()
        self.image = BeginBlock(
            nn.Sequential(nn.Flatten(), nn.Linear(48, HIDDEN)), "image", ipu_id=0
        )
        self.image_layer = _Encoder()
        self.text = BeginBlock(nn.Embedding(VOCAB, HIDDEN), "text", ipu_id=1)
        self.text_layer = _Encoder()
        self.logit_scale = nn.Parameter(torch.tensor(2.0))
        self.register_buffer("image_norm", torch.ones(()))

    def forward(self, pixels: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        image = self.image_layer(self.image(pixels).unsqueeze(1))[:, 0]
        with torch.no_grad():
            self.image_norm.mul_(0.9).add_(0.1 * image.norm(dim=-1).mean())
        text = self.text_layer(self.text(ids))
        text = text[torch.arange(text.shape[0]), ids.argmax(dim=-1)]
        image = image / image.norm(dim=-1, keepdim=True)
        text = text / text.norm(dim=-1, keepdim=True)
        logits = self.logit_scale.exp() * image @ text.t()
        target = torch.arange(logits.shape[0])
        loss = (
            nn.functional.cross_entropy(logits, target)
            + nn.functional.cross_entropy(logits.t(), target)
        ) / 2
        return {"logits_per_image": logits, "loss": loss}
