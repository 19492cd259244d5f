"""The fused training micro-step captured in a graph and replayed (a GPU's CUDA graphs).

``eligibility.py`` says, purely, whether a step may be captured (from the plan, then from
what the first eager step showed); ``facts.py`` watches that step; ``seam.py`` is the one
seam to the device (CUDA graphs, or a re-run on the CPU for tests); ``graphed.py`` keeps the
warm-up, the static buffers, the guards and the cache of graphs.
"""

from __future__ import annotations

from popdist_torch.execution.capture.eligibility import StepFacts, plan_refusal, step_refusal
from popdist_torch.execution.capture.graphed import GraphedSteps
from popdist_torch.execution.capture.seam import (
    BACKENDS,
    CudaGraphs,
    GraphBackend,
    RerunGraphs,
    backend_for,
)

__all__ = [
    "BACKENDS",
    "CudaGraphs",
    "GraphBackend",
    "GraphedSteps",
    "RerunGraphs",
    "StepFacts",
    "backend_for",
    "plan_refusal",
    "step_refusal",
]
