"""The one error root of popdist_torch: every error the executor raises is a :class:`PopdistTorchError`.

Each concrete error is also the built-in a caller would catch without knowing this package
(``ValueError`` for a bad value or call, ``RuntimeError`` for a state that cannot be
honoured), so ``except ValueError`` written for PopTorch keeps working.
"""

from __future__ import annotations

from popdist.env import PopdistError

__all__ = ["CollectiveError", "PopdistTorchError"]


class PopdistTorchError(Exception):
    """Root of every popdist_torch error; the message names the value and the fix."""


class CollectiveError(PopdistTorchError, PopdistError):
    """The collective backend is missing, or disagrees with the run or the options.

    Also a :class:`popdist.PopdistError` (a ``RuntimeError``): ``popdist.init()`` raises it.
    """
