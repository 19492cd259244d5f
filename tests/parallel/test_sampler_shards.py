"""Any sampler, sharded over 1, 2 and 3 instances under poprun, against one process's epoch.

A PopTorch program with its own ``import poptorch`` (``poprun --poptorch-modules``) builds its
loaders as optimum-graphcore's trainer does: ``sampler=RandomSampler(dataset)`` for training,
``SequentialSampler`` for evaluation (and a user's own sampler), with automatic partitioning.
Each instance takes its part of the sampler's epoch by the batch_sampler rule: the instances'
batches, taken in round order, are the single-process epoch, no sample twice (issue 54; the
logic: tests/unit/test_dataloader_samplers.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from torch.utils.data import RandomSampler

from popdist_torch.data.samplers import sampler_epoch
from tests.support.jobs import ROOT, poprun_argv, run_job

pytestmark = [pytest.mark.parallel, pytest.mark.slow]

SCRIPT = str(ROOT / "tests" / "bin" / "sampler_shards.py")
SAMPLES, SEED, BATCH = 50, 42, 2


def single_process_epoch(kind: str, epoch: int) -> list[int]:
    if kind == "sequential":
        return list(range(SAMPLES))
    if kind == "own":
        return list(range(SAMPLES - 1, -1, -1))
    return sampler_epoch(RandomSampler(range(SAMPLES)), SEED, epoch)  # seeded by randomSeed


def shards(instances: int) -> list[dict[str, Any]]:
    launch = ["--poptorch-modules", "--num-instances", str(instances)]
    done = run_job(poprun_argv(*launch, "--num-replicas", str(instances), sys.executable, SCRIPT))
    assert done.returncode == 0, done.stdout
    found = [
        json.loads(line.split("SHARDS ", 1)[1])
        for line in done.stdout.splitlines()
        if "SHARDS " in line
    ]
    assert sorted(r["instance"] for r in found) == list(range(instances)), done.stdout
    return sorted(found, key=lambda r: r["instance"])


@pytest.mark.parametrize("instances", [1, 2, 3])
def test_every_sampler_is_sharded_into_the_single_process_epoch(instances: int) -> None:
    found = shards(instances)
    width = BATCH * instances
    for kind in ("random", "sequential", "own"):
        for epoch in range(2):
            per_instance = [r[kind][epoch] for r in found]
            assert len({len(b) for b in per_instance}) == 1, kind  # as many batches each
            rounds = zip(*per_instance, strict=True)
            got = [i for batches in rounds for batch in batches for i in batch]
            assert len(got) == len(set(got)) == SAMPLES // width * width, kind
            if kind == "random" and instances == 1:
                continue  # one process, PopTorch's order: torch draws the order, as before
            expected = single_process_epoch(kind, epoch)
            assert got == expected[: len(got)], (kind, epoch)
    if instances > 1:
        assert found[0]["random"][0] != found[0]["random"][1]  # a new order each epoch
