"""What IPUStrategy refuses, each with the one-line fix: arguments, accelerator, Trainer.

Every check raises :class:`~popdist_lightning.errors.IPUStrategyError` naming the value
and what to do instead; nothing is started or changed before it passes.
"""

from __future__ import annotations

import os
from typing import Any

import popdist
import popdist_torch as poptorch
from popdist_lightning.errors import IPUStrategyError

__all__ = [
    "check_accelerator",
    "check_arguments",
    "check_devices",
    "check_optimizers",
    "check_trainer",
]


def check_arguments(
    autoreport: Any,
    autoreport_dir: Any,
    autoreport_options: Any,
    device_iterations: Any,
    training_opts: Any,
    inference_opts: Any,
) -> None:
    """``IPUStrategy(...)``'s own arguments."""
    if not isinstance(autoreport, bool):
        raise IPUStrategyError(f"IPUStrategy(autoreport={autoreport!r}): expected True or False")
    if autoreport_dir is not None and not isinstance(autoreport_dir, (str, os.PathLike)):
        raise IPUStrategyError(
            f"IPUStrategy(autoreport_dir={autoreport_dir!r}): expected a directory path"
        )
    if autoreport_options is not None and (
        not isinstance(autoreport_options, dict)
        or not all(isinstance(key, str) for key in autoreport_options)
    ):
        raise IPUStrategyError(
            f"IPUStrategy(autoreport_options={autoreport_options!r}): expected a dict of "
            f"option names to values (Poplar's autoReport.* options, recorded in the report)"
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


def check_devices(replication_factor: int, source: str) -> None:
    """The local replicas (``source``: how they were asked for) against poprun's."""
    if popdist.isPopdistEnvSet() and replication_factor != popdist.getNumLocalReplicas():
        local = popdist.getNumLocalReplicas()
        fix = (
            f"pass devices={local} or devices='auto'"
            if source.startswith("Trainer(")
            else f"make it replicationFactor({local}) or drop it"
        )
        raise IPUStrategyError(
            f"{source} but poprun gave this instance {local} local replicas (--num-replicas "
            f"{popdist.getNumTotalReplicas()} over {popdist.getNumInstances()} instances): "
            f"{fix}"
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
