"""``IPUStrategy`` and its parts, one concept a module.

``ipu.py`` is the strategy Lightning talks to; it delegates: ``checks`` (the arguments,
Trainer, optimizers and loaders it can run, each refusal one ``IPUStrategyError`` line),
``options`` (the user's ``poptorch.Options`` completed from ``devices``,
``device_iterations`` and ``accumulate_grad_batches``), ``loaders`` (a torch ``DataLoader``
rebuilt as the executor's), ``executors`` (one ``trainingModel``/``inferenceModel`` per step
method) around ``step``'s wrappers, which carry ``self.log`` values out of the executor.
"""

from __future__ import annotations

from popdist_lightning.strategy.ipu import IPUStrategy

__all__ = ["IPUStrategy"]
