"""The options IPUStrategy runs with: the user's ``poptorch.Options`` completed from its own
arguments (``devices``, ``device_iterations``, ``accumulate_grad_batches``), and the seed
that makes every instance shuffle alike.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch.utils import data as tud

import popdist_torch as poptorch
from popdist_lightning.errors import IPUStrategyError
from popdist_torch.pipeline import ShardedExecution

__all__ = ["SHARDED_NOTE", "complete_options", "seed_shuffling"]

SHARDED_NOTE = (
    "IPUStrategy: the module's blocks run as ShardedExecution (gradient accumulation 1 cannot "
    "fill a pipeline); set accumulate_grad_batches >= the number of stages to pipeline them"
)


def _set_replicas(opts: poptorch.Options, name: str, replicas: int) -> None:
    if opts.replication_factor == replicas:
        return
    if opts.replication_factor != 1:
        raise IPUStrategyError(
            f"{name}.replicationFactor({opts.replication_factor}) contradicts "
            f"Trainer(devices={replicas}): set devices={opts.replication_factor} or drop "
            f"the replicationFactor call (devices sets it)"
        )
    try:
        opts.replicationFactor(replicas)
    except RuntimeError:  # popdist.poptorch.Options: the launch fixes it
        raise IPUStrategyError(
            f"{name} is a popdist.poptorch.Options with {opts.replication_factor} local "
            f"replica(s) (the launch's) but Trainer(devices={replicas}): pass "
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
    _set_replicas(opts, name, replicas)
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
