"""The world a wrapped model's process runs in, read once: the impure half of the plan.

:func:`read_world` asks torch how many GPUs the process sees, popdist whether the run's
collectives reach other processes (their declared capabilities, nothing started) and how
the replicas are split over the instances, and the capture seam whether the device has a
graph backend; :func:`model_facts` reads what the plan needs of the module and options.
:func:`popdist_torch.execution.setup.plan.resolve` does the rest, purely.
"""

from __future__ import annotations

import torch
from torch import nn

import popdist.collectives
from popdist_torch.execution.anchors import OUTPUT
from popdist_torch.execution.capture.seam import backend_for
from popdist_torch.execution.setup.plan import ModelFacts, World
from popdist_torch.options import Options
from popdist_torch.options.distributed import replica_counts

__all__ = ["model_facts", "read_world"]


def read_world(options: Options, device: torch.device) -> World:
    """This process's :class:`World`; ``device`` is where an unstaged model would compute
    (:func:`~popdist_torch.execution.placement.instance_device`)."""
    dist = options.Distributed
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return World(
        device=device,
        visible_gpus=gpus,
        communicates=popdist.collectives.capabilities(dist.numProcesses).communicates,
        replica_counts=replica_counts(
            dist.numProcesses, dist.processId, options.replication_factor
        ),
        captures=backend_for(device) is not None,
    )


def model_facts(model: nn.Module, options: Options) -> ModelFacts:
    """What the plan needs of ``model`` under ``options``."""
    from popdist_torch.pipeline import has_block_annotations

    staged = options.execution_strategy is not None or has_block_annotations(model)
    anchors = getattr(options, "anchored_tensors", ())
    return ModelFacts(
        staged=staged, output_anchors=any(a.long_name.startswith(OUTPUT) for a in anchors)
    )
