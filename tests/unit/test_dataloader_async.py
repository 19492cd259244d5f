"""The Async modes really load ahead in the background, and stop when told to."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils import data as tud

from popdist_torch.data import DataLoader
from popdist_torch.enums import DataLoaderMode
from popdist_torch.options import Options

pytestmark = pytest.mark.unit

SIGNAL_TIMEOUT_S = 30.0  # only reached when the behaviour under test is broken


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


def test_async_loads_the_next_batch_before_it_is_asked_for() -> None:
    data = Gated(8, gate=2)
    loader = DataLoader(Options(), data, batch_size=2, mode=DataLoaderMode.Async)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    # Batch 1 (samples 2, 3) is being read while the consumer holds batch 0.
    assert data.started.wait(SIGNAL_TIMEOUT_S)
    data.release.set()
    assert [b.tolist() for b in it] == [[2, 3], [4, 5], [6, 7]]
    loader.terminate()
    assert not prefetch_threads()


def test_sync_does_not_load_ahead() -> None:
    data = Gated(8, gate=2)
    data.release.set()
    loader = DataLoader(Options(), data, batch_size=2)
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    assert not data.started.is_set()
    assert not prefetch_threads()


def test_terminate_mid_epoch_stops_the_thread() -> None:
    data = Gated(40, gate=-1)
    loader = DataLoader(
        Options(), data, batch_size=2, mode=DataLoaderMode.Async, async_options={"buffer_size": 2}
    )
    it = iter(loader)
    next(it)
    assert prefetch_threads()
    loader.terminate()
    assert not prefetch_threads()


def test_a_new_epoch_replaces_an_abandoned_one() -> None:
    loader = DataLoader(Options(), Gated(20, gate=-1), batch_size=2, mode=DataLoaderMode.Async)
    next(iter(loader))
    second = [b.tolist() for b in loader]
    assert second == [[i, i + 1] for i in range(0, 20, 2)]
    assert not prefetch_threads()  # the abandoned epoch's thread was stopped, the new one ended


def test_errors_reach_the_consumer() -> None:
    loader = DataLoader(
        Options(), Gated(8, gate=-1, fail_at=5), batch_size=2, mode=DataLoaderMode.Async
    )
    it = iter(loader)
    assert next(it).tolist() == [0, 1]
    assert next(it).tolist() == [2, 3]
    with pytest.raises(KeyError, match="sample 5 is broken"):
        next(it)
    loader.terminate()
