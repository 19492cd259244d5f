"""Two instances out of step in an explicit allreduce (issue 27's desync, not a gradient).

``desync_metric.py``, launched by poprun with two instances: both train a few steps alike,
then each sums its metrics with ``allreduce_``; instance 1 has one metric more (shape (3,)
against (2,)), as when a metric is logged on one branch only. Horovod checks the shapes
itself and raises on every instance; torch's backend would truncate or wait.
"""

from __future__ import annotations

import torch

import popdist
import popdist.collectives
from popdist.collectives.base import Collectives


def sum_metrics(collectives: Collectives, metrics: list[float]) -> None:
    collectives.allreduce_(torch.tensor(metrics), name="metrics")


def main() -> None:
    popdist.init()
    me = popdist.getInstanceIndex()
    collectives = popdist.collectives.for_run()
    for _ in range(3):
        collectives.allreduce_(torch.ones(4), name="step")
    metrics = [1.0, 2.0, 3.0] if me == 1 else [1.0, 2.0]
    sum_metrics(collectives, metrics)
    print(f"instance {me} done", flush=True)


if __name__ == "__main__":
    main()
