"""The DataLoader with torch's worker processes (``num_workers > 0``): they start processes,
so they live in this tier, not in ``tests/unit``."""

from __future__ import annotations

import pytest

from popdist_torch.data import DataLoader
from popdist_torch.enums import DataLoaderMode
from popdist_torch.options import Options
from tests.support.data import Gated, Stream, make_options, prefetch_threads

pytestmark = pytest.mark.parallel


def test_iterable_dataset_is_sharded_by_worker_too() -> None:
    got: list[int] = []
    for pid in range(2):
        loader = DataLoader(make_options(pid, 2), Stream(40), batch_size=2, num_workers=2)
        got.extend(i for b in loader for i in b.tolist())
        loader.terminate()
    assert sorted(got) == list(range(40))


def test_async_with_worker_processes_and_terminate() -> None:
    """Workers keep loading underneath; terminate leaves no thread or process behind."""
    data = Gated(64, gate=-1)
    loader = DataLoader(Options(), data, batch_size=4, num_workers=2, mode=DataLoaderMode.Async)
    assert [b.tolist() for b in loader] == [list(range(i, i + 4)) for i in range(0, 64, 4)]
    it = iter(loader)
    next(it)
    loader.terminate()
    assert not prefetch_threads()
    # the conftest fixture fails this test if a worker process survives
