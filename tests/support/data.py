"""Small datasets, models and options the unit and parallel tiers both use."""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.utils import data as tud

from popdist_torch.data import current_shard
from popdist_torch.options import Options

#: How long a gated read waits for its release: reached only when the code under test is broken.
SIGNAL_TIMEOUT_S = 30.0


def make_options(
    process_id: int = 0,
    processes: int = 1,
    *,
    device_iterations: int = 1,
    replicas: int = 1,
    accumulation: int = 1,
    seed: int | None = None,
) -> Options:
    opts = Options()
    opts.deviceIterations(device_iterations).replicationFactor(replicas)
    opts.Training.gradientAccumulation(accumulation)
    opts.Distributed.configureProcessId(process_id, processes)
    if seed is not None:
        opts.randomSeed(seed)
    return opts


class Stream(tud.IterableDataset[torch.Tensor]):
    def __init__(self, n: int, self_sharding: bool = False) -> None:
        self.n = n
        self.self_sharding = self_sharding

    def __iter__(self) -> Any:
        index, count = current_shard() if self.self_sharding else (0, 1)
        for i in range(index, self.n, count):
            yield torch.tensor(i)


class Gated(tud.Dataset[torch.Tensor]):
    """Reading sample ``gate`` announces itself, then waits for the test to release it."""

    def __init__(self, n: int, gate: int, fail_at: int | None = None) -> None:
        self.n = n
        self.gate = gate
        self.fail_at = fail_at
        self.started = threading.Event()
        self.release = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.fail_at:
            raise KeyError(f"sample {i} is broken")
        if i == self.gate:
            self.started.set()
            if not self.release.wait(SIGNAL_TIMEOUT_S):
                raise TimeoutError("the test never released the gate")
        return torch.tensor(i)


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "popdist-dataloader"]


def net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
