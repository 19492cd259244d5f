"""PopTorch's ``AsynchronousDataAccessor``: any iterable, read ahead in a background thread."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from popdist_torch.data.prefetch import Prefetcher

__all__ = ["AsynchronousDataAccessor"]


class AsynchronousDataAccessor:
    """Iterate ``dataset`` (usually a ``DataLoader``) in a background thread.

    Keeps ``buffer_size`` items ready ahead of the consumer, as PopTorch's accessor does
    with a worker process; the other PopTorch arguments are accepted and have no effect.
    """

    def __init__(
        self,
        dataset: Iterable[Any],
        buffer_size: int = 3,
        miss_sleep_time_in_ms: float = 0.1,
        load_indefinitely: bool = True,
        early_preload: bool = False,
        sharing_strategy: Any = None,
        rebatched_size: int | None = None,
    ) -> None:
        self._dataset = dataset
        self._buffer_size = buffer_size
        self._prefetcher: Prefetcher[Any] | None = None

    def __len__(self) -> int:
        return len(self._dataset)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        self.terminate()
        self._prefetcher = Prefetcher(iter(self._dataset), depth=self._buffer_size)
        return iter(self._prefetcher)

    def terminate(self) -> None:
        """Stop the background thread (PopTorch: the worker process)."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def __del__(self) -> None:
        self.terminate()
