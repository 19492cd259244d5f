"""The one error root of popdist_torch: every error the executor raises is a :class:`PopdistTorchError`.

Each concrete error is also the built-in a caller would catch without knowing this package
(``ValueError`` for a bad value or call, ``RuntimeError`` for a state that cannot be
honoured), so ``except ValueError`` written for PopTorch keeps working. The modules that
raise them re-export them (``popdist_torch.options.OptionsError``...). The one error that is
not a :class:`PopdistTorchError` is :class:`CollectiveError`, re-exported from
:mod:`popdist.collectives`, which owns the backends: a :class:`popdist.PopdistError` (a
``RuntimeError``) that ``popdist.init()`` and the backends raise.
"""

from __future__ import annotations

from popdist.collectives.errors import CollectiveError

__all__ = [
    "CheckpointError",
    "CollectiveError",
    "DataLoaderError",
    "ExecutorError",
    "ExecutorStateError",
    "FrozenOptionsError",
    "OptimizerError",
    "OptionsError",
    "PipelineError",
    "PopdistTorchError",
    "UnsupportedOptionError",
]


class PopdistTorchError(Exception):
    """Root of every popdist_torch error; the message names the value and the fix."""


class OptionsError(PopdistTorchError, ValueError):
    """An option was given a value it cannot take."""


class FrozenOptionsError(PopdistTorchError, RuntimeError):
    """A setter was called on options a DataLoader (or ``_freeze()``) has frozen."""


class UnsupportedOptionError(PopdistTorchError, RuntimeError):
    """A PopTorch option that has no meaning on this executor, or that the launch fixes."""


class DataLoaderError(PopdistTorchError, ValueError):
    """DataLoader arguments (or a dataset) that cannot give combined batches."""


class ExecutorError(PopdistTorchError, ValueError):
    """A model, batch or option combination the executor cannot run."""


class ExecutorStateError(PopdistTorchError, RuntimeError):
    """A wrapped model used in a state that does not allow the call (destroyed, detached)."""


class OptimizerError(PopdistTorchError, ValueError):
    """A PopTorch optimizer argument that cannot be honoured."""


class PipelineError(PopdistTorchError, ValueError):
    """A model, its annotations or its strategy cannot be run as stages."""


class CheckpointError(PopdistTorchError, RuntimeError):
    """A checkpoint could not be written or read back."""
