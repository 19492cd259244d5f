"""The options IPUStrategy runs with: the user's ``poptorch.Options`` completed from its own
arguments (``devices``, ``device_iterations``, ``accumulate_grad_batches``), and the seed
that makes every instance shuffle alike.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils import data as tud

import popdist_torch as poptorch
from popdist_lightning.errors import IPUStrategyError
from popdist_torch.pipeline import ShardedExecution

__all__ = ["SHARDED_NOTE", "complete_options", "resolve_replicas", "seed_shuffling"]

SHARDED_NOTE = (
    "IPUStrategy: the module's blocks run as ShardedExecution (gradient accumulation 1 cannot "
    "fill a pipeline); set accumulate_grad_batches >= the number of stages to pipeline them"
)


def resolve_replicas(
    devices: list[torch.device] | None,
    training: poptorch.Options | None,
    inference: poptorch.Options | None,
) -> tuple[list[torch.device] | None, str]:
    """One device entry per local replica to run, and how the user asked for them.

    ``devices`` is Lightning's list for ``Trainer(devices=...)``. As Lightning 1.9 did, a
    ``replicationFactor(n)`` in the user's options (the training options first) gives the
    replicas when ``devices`` is 1 or left out; ``devices`` > 1 beside a different
    ``replicationFactor`` other than 1 is an error naming both. The second value names
    the source for later messages (``"Trainer(devices=2)"``).
    """
    if not devices:  # not yet set by the Trainer
        return devices, "Trainer(devices=1)"
    count = len(devices)
    for name, opts in (("training_opts", training), ("inference_opts", inference)):
        factor = opts.replication_factor if opts is not None else 1
        if factor in (1, count):
            continue
        if count == 1:
            return devices * factor, f"{name}.replicationFactor({factor})"
        raise IPUStrategyError(
            f"{name}.replicationFactor({factor}) contradicts Trainer(devices={count}): "
            f"set devices={factor} (or leave devices out: replicationFactor sets the "
            f"replicas), or drop the replicationFactor call"
        )
    return devices, f"Trainer(devices={count})"


def _set_replicas(opts: poptorch.Options, name: str, replicas: int, source: str) -> None:
    if opts.replication_factor == replicas:
        return
    if opts.replication_factor != 1:
        raise IPUStrategyError(
            f"{name}.replicationFactor({opts.replication_factor}) contradicts {source}: "
            f"give both options the same replicationFactor, or drop the second call"
        )
    try:
        opts.replicationFactor(replicas)
    except RuntimeError:  # popdist.poptorch.Options: the launch fixes it
        raise IPUStrategyError(
            f"{name} is a popdist.poptorch.Options with {opts.replication_factor} local "
            f"replica(s) (the launch's) but the run has {replicas} ({source}): pass "
            f"devices={opts.replication_factor} or devices='auto'"
        ) from None


def _set_device_iterations(opts: poptorch.Options, name: str, di: int | None) -> None:
    if di is None or opts.device_iterations == di:
        return
    if opts.device_iterations != 1:
        raise IPUStrategyError(
            f"{name}.deviceIterations({opts.device_iterations}) contradicts "
            f"IPUStrategy(device_iterations={di}): give one of them"
        )
    opts.deviceIterations(di)


def _set_training(opts: poptorch.Options, accumulation: int, pipelined: bool) -> None:
    ga = opts.Training.gradient_accumulation
    if accumulation != 1 and ga not in (1, accumulation):
        raise IPUStrategyError(
            f"training_opts.Training.gradientAccumulation({ga}) contradicts "
            f"Trainer(accumulate_grad_batches={accumulation}): give one of them"
        )
    if accumulation != 1:
        opts.Training.gradientAccumulation(accumulation)
    if pipelined and opts.execution_strategy is None and opts.Training.gradient_accumulation == 1:
        # One micro-batch per weight update cannot fill a pipeline: run the stages one
        # after the other (same numbers); accumulation >= stages pipelines.
        rank_zero_info(SHARDED_NOTE)
        opts.setExecutionStrategy(ShardedExecution())


def complete_options(
    user: poptorch.Options | None,
    name: str,
    *,
    replicas: int,
    replicas_source: str,
    device_iterations: int | None,
    accumulation: int | None,
    pipelined: bool,
    rank: int,
    world_size: int,
) -> poptorch.Options:
    """The user's options (or defaults) completed from the strategy's arguments.

    ``accumulation`` is ``None`` for inference options. A contradiction between the two is
    an :class:`IPUStrategyError` naming both.
    """
    opts = user.clone() if user is not None else poptorch.Options()
    _set_replicas(opts, name, replicas, replicas_source)
    _set_device_iterations(opts, name, device_iterations)
    if accumulation is not None:
        _set_training(opts, accumulation, pipelined)
    dist = opts.Distributed
    if (dist.processId, dist.numProcesses) != (rank, world_size):
        dist.configureProcessId(rank, world_size)
    return opts


def seed_shuffling(loader: tud.DataLoader[Any], opts: poptorch.Options, world_size: int) -> None:
    """Instances must shuffle alike: seed from ``seed_everything`` when options have none."""
    shuffles = isinstance(getattr(loader, "sampler", None), tud.RandomSampler)
    if not shuffles or world_size == 1 or opts.random_seed is not None:
        return
    seed = os.environ.get("PL_GLOBAL_SEED")
    if seed is None:
        raise IPUStrategyError(
            "a shuffled DataLoader over several instances needs one seed everywhere: call "
            "lightning.pytorch.seed_everything(...) before the Trainer, or set "
            "training_opts.randomSeed(...)"
        )
    opts.randomSeed(int(seed))
