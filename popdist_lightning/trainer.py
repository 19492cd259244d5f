"""``popdist_lightning.Trainer``: Lightning's Trainer that names Lightning 1.x arguments' successors.

A Lightning 1.9 IPU program passes ``Trainer(ipus=8)`` or ``progress_bar_refresh_rate=...``;
Lightning 2's Trainer answers with ``TypeError: unexpected keyword argument``. Importing
the Trainer from here instead (the import line changes, as the strategy's does) turns
each such argument into one :class:`~popdist_lightning.errors.IPUStrategyError` line that
names its Lightning 2 replacement (:data:`~popdist_lightning.legacy.REMOVED_TRAINER_ARGUMENTS`).
It is otherwise Lightning's Trainer: Lightning itself is not patched.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from popdist_lightning.legacy import check_trainer_arguments

__all__ = ["Trainer"]


class Trainer(pl.Trainer):
    """``lightning.pytorch.Trainer``, refusing removed Lightning 1.x arguments in one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_trainer_arguments(kwargs)
        super().__init__(*args, **kwargs)
