"""What IPUStrategy refuses, each with the one-line fix: arguments, Trainer, loaders.

Every check raises :class:`~popdist_lightning.errors.IPUStrategyError` naming the value
and what to do instead; nothing is started or changed before it passes.
"""

from __future__ import annotations

from typing import Any

import popdist
import popdist_torch as poptorch
from popdist_lightning.errors import IPUStrategyError

__all__ = [
    "check_accelerator",
    "check_arguments",
    "check_devices",
    "check_loader",
    "check_optimizers",
    "check_trainer",
]


def check_arguments(
    autoreport: bool,
    autoreport_dir: str | None,
    device_iterations: Any,
    training_opts: Any,
    inference_opts: Any,
) -> None:
    """``IPUStrategy(...)``'s own arguments."""
    if autoreport or autoreport_dir is not None:
        raise IPUStrategyError(
            "IPUStrategy(autoreport=True / autoreport_dir=...): PopVision reports come from "
            "Poplar, which popdist_torch does not use; leave autoreport unset and profile "
            "with Trainer(profiler='simple') or torch.profiler"
        )
    if device_iterations is not None and (
        isinstance(device_iterations, bool)
        or not isinstance(device_iterations, int)
        or device_iterations < 1
    ):
        raise IPUStrategyError(
            f"IPUStrategy(device_iterations={device_iterations!r}): expected an integer >= 1"
        )
    for name, opts in (("training_opts", training_opts), ("inference_opts", inference_opts)):
        if opts is not None and not isinstance(opts, poptorch.Options):
            raise IPUStrategyError(
                f"IPUStrategy({name}={type(opts).__name__}): expected poptorch.Options"
            )


def check_accelerator(accelerator: Any) -> None:
    """The "ipu" accelerator (or Lightning's CPU one, which it runs on)."""
    from popdist_lightning.accelerator import IPUAccelerator

    if (
        accelerator is not None
        and not isinstance(accelerator, IPUAccelerator)
        and type(accelerator).__name__ != "CPUAccelerator"
    ):
        raise IPUStrategyError(
            f"IPUStrategy with accelerator {type(accelerator).__name__}: use "
            f"Trainer(accelerator='ipu')"
        )


def check_devices(replication_factor: int) -> None:
    """``Trainer(devices=...)`` against the local replicas poprun gave the instance."""
    if popdist.isPopdistEnvSet() and replication_factor != popdist.getNumLocalReplicas():
        raise IPUStrategyError(
            f"Trainer(devices={replication_factor}) but poprun gave this instance "
            f"{popdist.getNumLocalReplicas()} local replicas (--num-replicas "
            f"{popdist.getNumTotalReplicas()} over {popdist.getNumInstances()} instances): "
            f"pass devices={popdist.getNumLocalReplicas()} or devices='auto'"
        )


def check_trainer(trainer: Any) -> None:
    """Trainer settings the executor cannot honour."""
    flag = trainer._accelerator_connector._precision_flag
    if flag not in ("32-true", "32", 32):
        raise IPUStrategyError(
            f"Trainer(precision={flag!r}) is not supported by IPUStrategy: it trains in "
            f"float32; leave precision at its default"
        )
    if trainer.gradient_clip_val:
        raise IPUStrategyError(
            f"Trainer(gradient_clip_val={trainer.gradient_clip_val}) is not supported by "
            f"IPUStrategy: the executor steps the optimizer inside its call; remove the "
            f"option (or clip inside the optimizer)"
        )
    module = trainer.lightning_module
    if module is not None and not module.automatic_optimization:
        raise IPUStrategyError(
            "automatic_optimization=False is not supported by IPUStrategy: the executor "
            "runs backward and the optimizer step; use automatic optimization"
        )


def check_optimizers(optimizers: list[Any]) -> None:
    """Exactly one optimizer from ``configure_optimizers``: the executor steps it."""
    if len(optimizers) != 1 or type(optimizers[0]).__name__ == "_MockOptimizer":
        raise IPUStrategyError(
            f"configure_optimizers returned {len(optimizers)} optimizers: IPUStrategy "
            f"trains with exactly one (the executor steps it)"
        )


def check_loader(loader: poptorch.DataLoader, opts: poptorch.Options) -> None:
    """A user's popdist_torch DataLoader must be built with the strategy's options."""
    theirs = loader.options
    mine = (
        opts.device_iterations,
        opts.replication_factor,
        opts.Training.gradient_accumulation,
    )
    got = (
        theirs.device_iterations,
        theirs.replication_factor,
        theirs.Training.gradient_accumulation,
    )
    if got != mine:
        raise IPUStrategyError(
            f"a poptorch.DataLoader built with (deviceIterations, replicationFactor, "
            f"gradientAccumulation) = {got} feeds a model run with {mine}: build it with the "
            f"strategy's options, or return a torch DataLoader and let IPUStrategy rebuild it"
        )
