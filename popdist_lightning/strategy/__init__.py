"""``IPUStrategy`` and its parts, one concept a module.

``ipu.py`` is the strategy Lightning talks to; it delegates: ``checks`` (the arguments,
Trainer and optimizers it can run, each refusal one ``IPUStrategyError`` line),
``options`` (the user's ``poptorch.Options`` completed from ``devices``,
``device_iterations`` and ``accumulate_grad_batches``; the replicas from the user's
``replicationFactor``), ``loaders`` (a torch ``DataLoader`` rebuilt as the executor's, a
user's poptorch ``DataLoader`` rebuilt for the completed options), ``executors`` (one
``trainingModel``/``inferenceModel`` per step method) around ``step``'s wrappers, which
carry ``self.log`` values out of the executor, and ``report`` (``autoreport=True``: the
executor's schedule profile).
"""

from __future__ import annotations

from popdist_lightning.strategy.ipu import IPUStrategy

__all__ = ["IPUStrategy"]
