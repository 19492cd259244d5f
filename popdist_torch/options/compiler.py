"""``opts.Jit`` and ``opts._Popart``: PopTorch's compiler settings, recorded, no effect.

The model runs eagerly on torch: there is no tracing and no PopART session, so every
setter of these groups is a no-op generated from its row in the surface table; the values
show in ``toDict()`` for programs that read them back.
"""

from __future__ import annotations

from popdist_torch.options.group import OptionGroup, install_setters

__all__ = ["JitOptions", "PopartOptions"]


@install_setters
class JitOptions(OptionGroup):
    """``opts.Jit``: PopTorch's tracing settings."""

    _owner = "Options.Jit"


@install_setters
class PopartOptions(OptionGroup):
    """``opts._Popart``: PopART session options (there is no PopART)."""

    _owner = "Options._Popart"
