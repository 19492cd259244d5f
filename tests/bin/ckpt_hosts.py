"""Child of tests/parallel/test_checkpoint_hosts.py: checkpoints on several "hosts".

Usage: ckpt_hosts.py OUT COUNTS HOSTS CKPT STOP [GENERATION]

Run under ``mpirun -np len(COUNTS)``. Instance ``i`` becomes poprun's instance ``i`` of 6
replicas split as COUNTS (e.g. ``2,2,2``), placed on host ``HOSTS[i]`` (e.g. ``h0,h1,h2``:
its local index counts the instances before it on the same host), in membership generation
GENERATION (default 0). It resumes from CKPT (``{host}`` in it becomes its host: one
directory per host stands for each host's own disk), trains with the deterministic
reduction on a shuffled topology-invariant DataLoader, saves CKPT after every step until
step STOP, then writes ``OUT/<tag>.<rank>.pt``: the final weights, the sample indices it
consumed and how many checkpoint files it wrote (tag: ``stop`` and the start step).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from popdist import env
from tests.bin.replica_split import DI, GA, MICRO, Mlp, Samples


def become_instance(counts: list[int], hosts: list[str], generation: str) -> int:
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    host = hosts[rank]
    os.environ.update(
        env.instance_environment(
            num_total_replicas=sum(counts),
            num_ipus_per_replica=1,
            num_instances=len(counts),
            instance_index=rank,
            local_instance_index=hosts[:rank].count(host),
            num_local_instances=hosts.count(host),
            host=host,
            num_local_replicas=counts[rank],
            replica_index_offset=sum(counts[:rank]),
        )
    )
    os.environ[env.GENERATION] = generation
    return rank


def main() -> None:
    out, ckpt, stop = Path(sys.argv[1]), sys.argv[4], int(sys.argv[5])
    counts = [int(c) for c in sys.argv[2].split(",")]
    rank = become_instance(
        counts, sys.argv[3].split(","), sys.argv[6] if len(sys.argv) > 6 else "0"
    )
    import popdist.poptorch
    import popdist_torch as poptorch
    from popdist_torch import checkpoint

    writes = 0
    atomic_save = checkpoint.atomic_save

    def counted(obj: object, path: str | os.PathLike[str]) -> None:
        nonlocal writes
        writes += 1
        atomic_save(obj, path)

    checkpoint.atomic_save = counted  # type: ignore[assignment]
    opts = popdist.poptorch.Options().deviceIterations(DI).randomSeed(11)
    opts.Training.gradientAccumulation(GA)
    opts.Training.deterministicReduction(True)
    torch.manual_seed(100 + rank)
    model = Mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.1)
    loader = poptorch.DataLoader(
        opts, Samples(), batch_size=MICRO, shuffle=True, order="topology_invariant"
    )
    start = checkpoint.resume_checkpoint(ckpt, model=model, optimizer=optimizer, dataloader=loader)
    wrapped = poptorch.trainingModel(model, opts, optimizer)
    consumed: list[int] = []
    step = start
    error = ""
    while step < stop and not error:
        for x, y, index in loader:
            wrapped(x, y, index)
            consumed.extend(index.tolist())
            step += 1
            try:
                checkpoint.save_checkpoint(
                    ckpt, model=model, optimizer=optimizer, step=step, dataloader=loader
                )
            except checkpoint.CheckpointError as exc:
                error = str(exc)
                break
            if step >= stop:
                break
    result = {"weights": model.state_dict(), "consumed": consumed, "writes": writes}
    torch.save({**result, "start": start, "error": error}, out / f"{stop}.{start}.{rank}.pt")


if __name__ == "__main__":
    main()
