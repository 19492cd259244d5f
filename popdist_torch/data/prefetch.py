"""Background prefetching for the asynchronous DataLoader modes.

A :class:`Prefetcher` drives an iterator in a daemon thread and keeps up to ``depth`` of its
items ready in a bounded queue, so loading the next combined batch overlaps the training
step that consumes the current one. Torch's worker processes (``num_workers > 0``) keep
working underneath: the thread only waits on their results.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast

import torch

from popdist_torch.errors import DataLoaderError

T = TypeVar("T")

_ITEM = 0
_END = 1
_ERROR = 2

#: How long :meth:`Prefetcher.close` waits for the thread once it was told to stop.
JOIN_TIMEOUT_S = 30.0


class Prefetcher(Generic[T]):
    """Iterate ``source`` in a background thread, ``depth`` items ahead of the consumer."""

    def __init__(self, source: Iterator[T], depth: int = 2, name: str = "popdist-prefetch"):
        if depth < 1:
            raise DataLoaderError(f"prefetch depth must be at least 1, got {depth}")
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, args=(source,), name=name, daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        """The producer thread (exposed for tests and diagnostics)."""
        return self._thread

    def _put(self, message: tuple[int, Any]) -> bool:
        """Block until ``message`` is queued; False if the consumer stopped us meanwhile."""
        while not self._stop.is_set():
            try:
                self._queue.put(message, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[T]) -> None:
        try:
            for item in source:
                if not self._put((_ITEM, item)) or self._stop.is_set():
                    return
            self._put((_END, None))
        except BaseException as exc:  # handed to the consumer, re-raised there
            self._put((_ERROR, exc))

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == _ITEM:
            return cast(T, value)
        self._finished = True
        self._thread.join()
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self) -> bool:
        """Stop the thread and drop prefetched items; True once the thread has ended."""
        self._finished = True
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(JOIN_TIMEOUT_S)
        return not self._thread.is_alive()


def concatenate_batches(batches: Sequence[Any]) -> Any:
    """Join collated batches along their first dimension, keeping their structure."""
    first = batches[0]
    if len(batches) == 1:
        return first
    if isinstance(first, torch.Tensor):
        return torch.cat(list(batches), dim=0)
    if isinstance(first, Mapping):
        return type(first)({k: concatenate_batches([b[k] for b in batches]) for k in first})  # type: ignore[call-arg]
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
        return type(first)(*(concatenate_batches(list(f)) for f in zip(*batches, strict=True)))
    if isinstance(first, (tuple, list)):
        return type(first)(concatenate_batches(list(f)) for f in zip(*batches, strict=True))
    raise TypeError(
        f"cannot rebatch a batch of type {type(first).__name__}: AsyncRebatched joins "
        "tensors, tuples, lists and mappings of them; use DataLoaderMode.Async instead"
    )


def rebatch(source: Iterable[Any], group: int, drop_last: bool) -> Iterator[Any]:
    """Join every ``group`` consecutive batches of ``source`` into one."""
    pending: list[Any] = []
    for batch in source:
        pending.append(batch)
        if len(pending) == group:
            yield concatenate_batches(pending)
            pending = []
    if pending and not drop_last:
        yield concatenate_batches(pending)
