"""Whether a training micro-step may be captured in a graph and replayed (pure).

A replay runs the kernels the capture recorded, on the addresses it recorded, and nothing
of the Python that issued them. It gives the eager step's numbers only where that step is
the same kernels every call, so the choice is conservative, and asked twice:

- :func:`plan_refusal`, when the model is wrapped, from the executor's plan: a training
  model with several local replicas, a device that can capture, no opt-out, the local
  replicas' runner (not pipeline stages, not the deterministic reduction), one instance
  (the cross-instance reducer's hooks are Python), no ``Output___`` anchor (a forward
  hook), no autocast (the replicas then run in turn);
- :func:`step_refusal`, from what a signature's first eager fused step showed, watched
  again after any change the replay's guard sees (:class:`StepFacts`): the replicas ran as
  one ``vmap`` (not in turn: BatchNorm running statistics, a model ``vmap`` cannot run,
  activation checkpointing), no random numbers (dropout: until a GPU shows replayed masks
  equal eager ones), no operation whose result or shape depends on the data (``.item()``,
  ``nonzero``), no saved-tensor hooks (activation checkpointing, offloading), no hook
  registered then (a module's, a global module hook, a parameter's), no 0-dim tensor
  argument (a replay would keep the first call's value).

Each returns ``None`` (eligible) or the reason, in words, for the one log line.
"""

from __future__ import annotations

from dataclasses import dataclass

from popdist.env import CUDA_GRAPHS

__all__ = ["StepFacts", "plan_refusal", "step_refusal"]


def plan_refusal(
    *,
    training: bool,
    replicas: int,
    device_captures: bool,
    enabled: bool,
    runner: str,
    reducer: bool,
    output_anchors: bool,
    autocast: bool,
) -> str | None:
    """Why a model cannot have its micro-step captured, known when it is wrapped (or None).

    ``replicas``: local replicas (one runs the model's plain step, not captured);
    ``device_captures``: the device has a graph backend (CUDA); ``enabled``: no opt-out
    (``Options.Training.cudaGraphs(False)``, :data:`popdist.env.CUDA_GRAPHS` ``=0``); ``runner``: the
    plan's (``"local"``, ``"staged"``, ``"deterministic"``); ``reducer``: gradients are
    reduced over other instances.
    """
    if not training:
        return "an inference model (only training steps are captured)"
    if replicas < 2:
        return "one local replica runs the model's own step (only the replicas' vmap is captured)"
    if not device_captures:
        return "the device has no graph capture (CUDA graphs)"
    if not enabled:
        return f"turned off (Options.Training.cudaGraphs(False) or {CUDA_GRAPHS}=0)"
    if runner == "staged":
        return "the model runs in pipeline stages"
    if runner == "deterministic":
        return "the deterministic reduction runs the replicas one by one"
    if reducer:
        return "the gradients are reduced over several instances (the reducer's hooks are Python)"
    if output_anchors:
        return "an Output___ anchor (a forward hook) watches a submodule"
    if autocast:
        return "autocast runs the replicas one after the other"
    return None


@dataclass(frozen=True)
class StepFacts:
    """What the first eager fused step showed (``in_turn``: why the replicas ran one after
    the other instead, ``None`` when they ran as one ``vmap``)."""

    in_turn: str | None = None
    random_ops: tuple[str, ...] = ()
    data_dependent_ops: tuple[str, ...] = ()
    saved_tensor_hooks: bool = False
    hooks: tuple[str, ...] = ()
    tensor_arguments: bool = False


def step_refusal(facts: StepFacts) -> str | None:
    """Why the watched step cannot be captured (or None): the first reason that applies."""
    if facts.in_turn is not None:
        return f"the replicas run one after the other ({facts.in_turn})"
    if facts.random_ops:
        return f"the step draws random numbers ({', '.join(facts.random_ops)})"
    if facts.data_dependent_ops:
        return (
            f"the step reads values or shapes from the data ({', '.join(facts.data_dependent_ops)})"
        )
    if facts.saved_tensor_hooks:
        return "saved-tensor hooks (activation checkpointing) run in the forward pass"
    if facts.hooks:
        return f"hooks run in the step ({', '.join(facts.hooks)})"
    if facts.tensor_arguments:
        return "a 0-dim tensor argument (a replay would keep the first call's value)"
    return None
