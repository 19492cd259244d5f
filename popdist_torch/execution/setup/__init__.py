"""A wrapped model's set-up, resolved once into a frozen plan.

``plan.py`` is the pure part: :class:`ModelFacts` and :class:`World` in, an
:class:`ExecutorPlan` out (:func:`resolve`: the device, the runner, the reduction, the
staging, whether the micro-step may be captured); ``world.py`` reads the world and the
model's facts; ``gpus.py`` words (and prints) the line an instance says when it leaves GPUs idle;
``build.py`` builds the replica runner the plan asks for.
"""

from __future__ import annotations

from popdist_torch.execution.setup.gpus import announce_idle_gpus, idle_gpus_note
from popdist_torch.execution.setup.plan import (
    NO_DETERMINISTIC_STAGES,
    ExecutorPlan,
    ModelFacts,
    World,
    resolve,
)
from popdist_torch.execution.setup.world import model_facts, read_world

__all__ = [
    "NO_DETERMINISTIC_STAGES",
    "ExecutorPlan",
    "ModelFacts",
    "World",
    "announce_idle_gpus",
    "idle_gpus_note",
    "model_facts",
    "read_world",
    "resolve",
]
