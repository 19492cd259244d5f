"""The options room: PopTorch's ``Options``, its groups and ``popdist.poptorch.Options``.

- :mod:`~popdist_torch.options.options`: ``Options``, the top-level settings (batching,
  replication, outputs, seeds, caching, the execution strategy);
- one module per group, by what it decides: ``training`` (accumulation, reduction),
  ``distributed`` (process id and count), ``tensor_locations`` (where optimizer state
  lives; ``TensorLocationSettings``), ``precision`` (autocast), ``compiler`` (``Jit``,
  ``_Popart``: recorded, no effect);
- :mod:`~popdist_torch.options.group`: what the groups share (freezing, recorded no-op
  values, ``toDict``) and the setters generated from the surface table
  (:mod:`popdist_torch.surface.names`): every no-op and refused setter is a row there;
- :mod:`~popdist_torch.options.launch`: ``PopdistOptions`` (``popdist.poptorch.Options``),
  options that follow the poprun launch.
"""

from popdist_torch.errors import FrozenOptionsError, OptionsError, UnsupportedOptionError
from popdist_torch.options.distributed import DistributedOptions
from popdist_torch.options.launch import PopdistDistributedOptions, PopdistOptions
from popdist_torch.options.options import Options
from popdist_torch.options.tensor_locations import TensorLocationSettings
from popdist_torch.surface.names import NAMES, OPTION_OWNERS
from popdist_torch.surface.rows import NO_OP

__all__ = [
    "NO_OP_OPTIONS",
    "DistributedOptions",
    "FrozenOptionsError",
    "Options",
    "OptionsError",
    "PopdistDistributedOptions",
    "PopdistOptions",
    "TensorLocationSettings",
    "UnsupportedOptionError",
]

#: The no-op setters of ``Options`` and its groups, by their path from ``Options()``
#: (``"Training.setConvolutionDithering"``), read from the surface table.
NO_OP_OPTIONS: tuple[str, ...] = tuple(
    row.path for row in NAMES if row.owner in OPTION_OWNERS and row.status == NO_OP
)
