"""``opts.Jit`` and ``opts._Popart``: PopTorch's compiler settings, recorded, no effect.

The model runs eagerly on torch: there is no tracing and no PopART session, so every
setter of these groups is a no-op generated from its row in the surface table; the values
show in ``toDict()`` for programs that read them back. ``opts._Popart`` keeps PopART's
session options by their PopART names in ``opts._Popart.options``, as PopTorch does; a key
that is no PopART session option (:func:`popdist_torch.popart.is_known_option`) is kept too,
with one warning per key, since it is most likely a typo.
"""

from __future__ import annotations

import warnings
from typing import Any

from popdist_torch.options.group import OptionGroup, install_setters

__all__ = ["JitOptions", "PopartOptions"]

#: Unknown session option keys already warned about (once per key and process).
_warned: set[str] = set()


@install_setters
class JitOptions(OptionGroup):
    """``opts.Jit``: PopTorch's tracing settings."""

    _owner = "Options.Jit"


@install_setters
class PopartOptions(OptionGroup):
    """``opts._Popart``: PopART session options (there is no PopART)."""

    _owner = "Options._Popart"

    @property
    def options(self) -> dict[str, Any]:
        """The session options set so far, by PopART name (PopTorch's ``_Popart.options``)."""
        return self._no_ops

    def _keep(self, key: str | None, value: Any) -> PopartOptions:
        from popdist_torch.popart import is_known_option  # lazily: ~10 ms of enum classes

        for name in value if key is None else (key,):
            if not is_known_option(name) and name not in _warned:
                _warned.add(name)
                warnings.warn(
                    f"opts._Popart.set({name!r}, ...): {name!r} is not a PopART session "
                    f"option; it is recorded and has no effect (check the spelling)",
                    UserWarning,
                    stacklevel=3,  # the caller of the setter
                )
        return super()._keep(key, value)
