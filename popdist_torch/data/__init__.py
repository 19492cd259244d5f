"""The data room: PopTorch's ``DataLoader`` and ``AsynchronousDataAccessor`` on torch.

- :mod:`~popdist_torch.data.loader`: ``DataLoader``, which owns the iteration (the epoch
  and batch it stands at, its seeds, the prefetch thread) and its checkpointable position;
- :mod:`~popdist_torch.data.plan`: ``LoaderPlan``, the frozen description of what the
  arguments mean, made once by :mod:`~popdist_torch.data.arguments` (checked by
  :mod:`~popdist_torch.data.checks`);
- :mod:`~popdist_torch.data.epoch_order`: ``EpochOrder``, the immutable order of one epoch
  (seed, epoch, this instance's indices, the worker seed), computed when the epoch starts;
- :mod:`~popdist_torch.data.samplers` and :mod:`~popdist_torch.data.streams`: what torch
  reads (an epoch's indices, combined micro-batches, a sharded ``IterableDataset``);
- :mod:`~popdist_torch.data.position`: what a checkpoint keeps of the topology, and how a
  saved batch maps onto another topology;
- :mod:`~popdist_torch.data.prefetch` and :mod:`~popdist_torch.data.accessor`: reading
  ahead in a background thread.
"""

from popdist_torch.data.accessor import AsynchronousDataAccessor
from popdist_torch.data.epoch_order import EpochOrder, Seeds
from popdist_torch.data.loader import DataLoader
from popdist_torch.data.plan import ORDER_POPTORCH, ORDER_TOPOLOGY_INVARIANT, ORDERS, LoaderPlan
from popdist_torch.data.streams import current_shard
from popdist_torch.enums import DataLoaderMode
from popdist_torch.errors import DataLoaderError

__all__ = [
    "ORDERS",
    "ORDER_POPTORCH",
    "ORDER_TOPOLOGY_INVARIANT",
    "AsynchronousDataAccessor",
    "DataLoader",
    "DataLoaderError",
    "DataLoaderMode",
    "EpochOrder",
    "LoaderPlan",
    "Seeds",
    "current_shard",
]
