"""popdist_torch: a PopTorch-like data-parallel executor on torch and Horovod.

``import popdist_torch as poptorch`` lets a PopTorch script run here unchanged.
"""

from popdist_torch.enums import DataLoaderMode, MeanReductionStrategy, OutputMode, ReductionType
from popdist_torch.options import (
    FrozenOptionsError,
    Options,
    OptionsError,
    TensorLocationSettings,
    UnsupportedOptionError,
)

__all__ = [
    "DataLoaderMode",
    "FrozenOptionsError",
    "MeanReductionStrategy",
    "Options",
    "OptionsError",
    "OutputMode",
    "ReductionType",
    "TensorLocationSettings",
    "UnsupportedOptionError",
]
