"""popdist_lightning: PyTorch Lightning (``lightning.pytorch`` 2.x) on popdist_torch.

``from popdist_lightning import IPUStrategy`` registers the ``"ipu"`` accelerator and the
``"ipu_strategy"`` strategy, so ``Trainer(accelerator="ipu", devices=N)`` runs on
popdist_torch's executor with ``N`` local replicas per instance, with or without an
explicit ``strategy=IPUStrategy(...)``; processes come from ``poprun``, never from
Lightning. ``popdist_lightning.Trainer`` is Lightning's Trainer that names the Lightning 2
replacement of a Lightning 1.x argument (``ipus=N``...) instead of a bare ``TypeError``.
See ``docs/lightning.md``.
"""

from __future__ import annotations

from popdist.heap import freeze_imports as _freeze_imports
from popdist_lightning.accelerator import IPUAccelerator
from popdist_lightning.environment import PopdistEnvironment
from popdist_lightning.errors import IPUStrategyError
from popdist_lightning.precision import IPUPrecision
from popdist_lightning.registry import register
from popdist_lightning.strategy import IPUStrategy
from popdist_lightning.trainer import Trainer

_freeze_imports()  # Lightning's import-time heap: no later collection walks it (popdist.heap)

__all__ = [
    "IPUAccelerator",
    "IPUPrecision",
    "IPUStrategy",
    "IPUStrategyError",
    "PopdistEnvironment",
    "Trainer",
]

register()
