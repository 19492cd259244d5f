"""The executor's replica runner, built from its plan.

One place turns :attr:`ExecutorPlan.runner` into a runner: the deterministic reduction's
(:class:`~popdist_torch.execution.deterministic.DeterministicReplicaRunner`, on its
per-replica gradient rows), the stages' (on the GPUs the plan gives them) or the local
replicas' (with the graphed micro-step when the plan allows a capture).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from popdist.collectives.base import Collectives
from popdist_torch.execution.capture.graphed import GraphedSteps
from popdist_torch.execution.capture.seam import BACKENDS
from popdist_torch.execution.deterministic import DeterministicReplicaRunner, ReplicaGradients
from popdist_torch.execution.reducer import GradientReducer
from popdist_torch.execution.runners import ReplicaRunner, make_runner
from popdist_torch.execution.setup.plan import ExecutorPlan
from popdist_torch.options import Options

__all__ = ["runner_for"]

log = logging.getLogger("popdist_torch.execution.executor")


def runner_for(
    plan: ExecutorPlan,
    model: nn.Module,
    options: Options,
    *,
    reducer: GradientReducer | None,
    collectives: Collectives | None,
    zero_grad: Callable[[], None] | None,
) -> ReplicaRunner:
    """The runner ``plan`` asks for, on ``model``; ``zero_grad`` restarts an update."""
    if plan.runner == "deterministic":
        rows = ReplicaGradients(
            collectives,
            model.named_parameters(),
            plan.replica_counts,
            options.Distributed.processId,
        )
        return DeterministicReplicaRunner(model, rows)
    graphs = None
    if plan.capture_refusal is None:  # the plan allows it only where the device captures
        graphs = GraphedSteps(model, BACKENDS[plan.device.type](plan.device))
    elif plan.training and plan.captures and plan.runner == "local":
        log.info(
            "the training micro-step runs eagerly, not captured in a graph: %s",
            plan.capture_refusal,
        )
    return make_runner(
        model,
        options,
        reducer=reducer,
        zero_grad=zero_grad,
        staged=plan.runner == "staged",
        device_type=plan.device.type,
        graphs=graphs,
        stage_gpus=plan.stage_gpus,
    )
