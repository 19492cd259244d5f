"""Sharded streams: one instance-and-worker shard of a user's ``IterableDataset``."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sized
from typing import Any

from torch.utils import data as tud

from popdist import sharding

__all__ = ["ShardedIterable", "current_shard"]

_shard_local = threading.local()


def current_shard() -> tuple[int, int]:
    """``(shard_index, num_shards)`` of the IterableDataset stream being read right now.

    Call it inside your ``IterableDataset.__iter__`` when the loader was built with
    ``auto_distributed_partitioning=False``: yield only the samples ``i`` with
    ``i % num_shards == shard_index``, or read only that part of your files. The shard
    accounts for the instance and for torch's worker process. Outside a loader's
    iteration it is ``(0, 1)``.
    """
    shard: tuple[int, int] | None = getattr(_shard_local, "shard", None)
    return shard if shard is not None else (0, 1)


class ShardedIterable(tud.IterableDataset[Any]):
    """Streams one instance-and-worker shard of a user's IterableDataset."""

    def __init__(self, dataset: Any, process_id: int, num_processes: int, auto: bool) -> None:
        self.dataset = dataset
        self.process_id = process_id
        self.num_processes = num_processes
        self.auto = auto

    def _shard(self) -> tuple[int, int]:
        info = tud.get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return sharding.worker_shard(self.process_id, self.num_processes, worker_id, num_workers)

    def __iter__(self) -> Iterator[Any]:
        index, count = self._shard()
        previous = getattr(_shard_local, "shard", None)
        _shard_local.shard = (index, count)
        try:
            stream = iter(self.dataset)
            if not self.auto or count == 1:
                yield from stream
                return
            cap = len(self.dataset) // count if isinstance(self.dataset, Sized) else None
            taken = 0
            for position, item in enumerate(stream):
                if position % count != index:
                    continue
                if cap is not None and taken >= cap:
                    return
                taken += 1
                yield item
        finally:
            _shard_local.shard = previous

    def __len__(self) -> int:
        if not isinstance(self.dataset, Sized):
            raise TypeError(f"{type(self.dataset).__name__} has no len()")
        if not self.auto:
            return len(self.dataset)
        return len(self.dataset) // self.num_processes
