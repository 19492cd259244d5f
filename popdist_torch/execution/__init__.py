"""Running a wrapped model: the executor and what one call goes through.

``executor.py`` is ``PoplarExecutor`` (``trainingModel``/``inferenceModel``), whose device
side (attachment, weight copies, random state) is ``device.py``. One call: ``batch.py`` views
the inputs as ``[device iterations, accumulation, replicas, micro-batch, ...]``;
``runners.py`` runs a device iteration's replicas (``vmap``ed or one after the other, or in
pipeline stages); ``reducer.py`` reduces the gradients across instances on popdist's
collectives; ``outputs.py`` keeps what the output mode returns; ``placement.py`` decides
once where the model, its optimizer state and each batch live.
"""

from __future__ import annotations

from popdist_torch.execution.executor import (
    PoplarExecutor,
    identity_loss,
    inferenceModel,
    trainingModel,
)

__all__ = ["PoplarExecutor", "identity_loss", "inferenceModel", "trainingModel"]
