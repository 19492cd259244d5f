"""Child of tests/parallel/test_topology_invariance.py: train under mpirun, save weights.

Usage: executor_topology.py OUT_DIR LOCAL_REPLICAS.  Each process (its id and count
read by ``Options.Distributed`` from Open MPI's environment) builds its models from a
seed of its own (the wrap-time broadcast must make them identical), feeds its replicas'
share of the global batches (global replica ``process_id * R + r``) and writes its final
weights to ``OUT_DIR/<model>.<rank>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import popdist_torch as poptorch
from tests.support.topology import CALLS, DI, GA, MODELS, OPTIMIZERS, global_data, make_model


def main() -> None:
    out_dir, local = Path(sys.argv[1]), int(sys.argv[2])
    for model_name in MODELS:
        for opt_name, make_opt in OPTIMIZERS.items():
            opts = poptorch.Options().deviceIterations(DI).replicationFactor(local)
            opts.Training.gradientAccumulation(GA)
            rank, size = opts.Distributed.processId, opts.Distributed.numProcesses
            model = make_model(model_name, seed=100 + rank)
            wrapped = poptorch.trainingModel(model, opts, make_opt(model))
            for call in range(CALLS):
                x, y = global_data(call, size * local)  # [DI, GA, P*R, B, ...]
                mine = slice(rank * local, (rank + 1) * local)
                xs, ys = x[:, :, mine].reshape(-1, x.shape[-1]), y[:, :, mine].reshape(-1)
                wrapped(xs, ys)
            torch.save(model.state_dict(), out_dir / f"{model_name}.{opt_name}.{rank}.pt")


if __name__ == "__main__":
    main()
