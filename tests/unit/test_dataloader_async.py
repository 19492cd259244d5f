"""The Async modes really load ahead in the background, and stop when told to."""

from __future__ import annotations

import pytest

from popdist_torch.data import DataLoader
from popdist_torch.enums import DataLoaderMode
from popdist_torch.options import Options
from tests.support.data import Gated, prefetch_threads

pytestmark = pytest.mark.unit

SIGNAL_TIMEOUT_S = 30.0  # only reached when the behaviour under test is broken


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
