"""The errors of ``popdist_lightning``: one class, a ``ValueError`` like the other packages'."""

from __future__ import annotations

__all__ = ["IPUStrategyError"]


class IPUStrategyError(ValueError):
    """A Trainer, strategy or module setting the IPU strategy cannot run; the message names it."""
