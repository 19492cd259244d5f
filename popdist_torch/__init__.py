"""popdist_torch: a PopTorch-like data-parallel executor on torch and Horovod.

``import popdist_torch as poptorch`` lets a PopTorch script run here unchanged.
"""

from popdist_torch import optim
from popdist_torch.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from popdist_torch.dataloader import DataLoader
from popdist_torch.enums import DataLoaderMode, MeanReductionStrategy, OutputMode, ReductionType
from popdist_torch.errors import (
    CollectiveError,
    DataLoaderError,
    ExecutorStateError,
    OptimizerError,
    PipelineError,
    PopdistTorchError,
)
from popdist_torch.executor import (
    ExecutorError,
    PoplarExecutor,
    identity_loss,
    inferenceModel,
    trainingModel,
)
from popdist_torch.launch_options import PopdistOptions
from popdist_torch.options import (
    FrozenOptionsError,
    Options,
    OptionsError,
    TensorLocationSettings,
    UnsupportedOptionError,
)

__all__ = [
    "CheckpointError",
    "CollectiveError",
    "DataLoader",
    "DataLoaderError",
    "DataLoaderMode",
    "ExecutorError",
    "ExecutorStateError",
    "FrozenOptionsError",
    "MeanReductionStrategy",
    "OptimizerError",
    "Options",
    "OptionsError",
    "OutputMode",
    "PipelineError",
    "PopdistOptions",
    "PopdistTorchError",
    "PoplarExecutor",
    "ReductionType",
    "TensorLocationSettings",
    "UnsupportedOptionError",
    "identity_loss",
    "inferenceModel",
    "load_checkpoint",
    "optim",
    "save_checkpoint",
    "trainingModel",
]
