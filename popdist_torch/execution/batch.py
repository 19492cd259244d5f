"""A call's batch split into micro-batches, and the helpers on one replica's outputs.

The leading dimension of every batched input is ``deviceIterations × gradientAccumulation
× localReplicas × micro-batch`` (PopART's host layout): :class:`Batch` views each such
input as ``[DI, GA, R, b, ...]`` without copying and rebuilds a model call's arguments from
per-replica leaves. Shared by the replica runners and the executor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_map, tree_unflatten

from popdist_torch.errors import ExecutorError
from popdist_torch.options import Options

__all__ = ["Batch", "detach", "detach_own", "stack"]


class Batch:
    """A call's inputs split into micro-batches: leaves shaped ``[DI, GA, R, b, ...]``.

    ``iterations``, ``accumulation`` and ``replicas`` are DI, GA and R. With ``device``,
    the batched inputs are moved there (the instance's GPU).
    """

    def __init__(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: Options,
        device: torch.device | None = None,
    ) -> None:
        di, ga, r = (
            opts.device_iterations,
            opts.Training.gradient_accumulation,
            opts.replication_factor,
        )
        factor = di * ga * r
        self.iterations, self.accumulation, self.replicas = di, ga, r
        # The common call, model(x, y): positional tensors only, no pytree walk to undo.
        self.spec: TreeSpec | None = None
        if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
            leaves, self.spec = tree_flatten((args, kwargs))
        else:
            leaves = list(args)
        self.constants: list[Any] = list(leaves)
        self.batched_index: list[int] = []
        self.batched: list[torch.Tensor] = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor) or leaf.dim() == 0:
                continue
            n = leaf.shape[0]
            if n % factor:
                raise ExecutorError(
                    f"Invalid batch dimension: In the input {self._name(i)}, the batch dimension "
                    f"({n}) must be a multiple of Options.deviceIterations({di}) * "
                    f"Options.replicationFactor({r}) * Options.Training.gradientAccumulation({ga}) "
                    f"= {factor} because it is used to calculate the batch size which will be "
                    f"executed on the device in any given iteration. For a full explanation see "
                    f"the batching semantics page of the documentation."
                )
            if device is not None and leaf.device != device:
                leaf = leaf.to(device, non_blocking=True)
            self.batched_index.append(i)
            self.batched.append(leaf.reshape(di, ga, r, n // factor, *leaf.shape[1:]))
        #: The samples of this call (every replica, accumulation step and device iteration).
        self.samples = factor * self.batched[0].shape[3] if self.batched else 0
        if not self.batched:
            raise ExecutorError(
                "the model call has no tensor input with a batch dimension: pass at least one "
                "tensor whose leading dimension holds the samples"
            )

    def _name(self, index: int) -> str:
        if self.spec is None:
            return f"argument {index}"
        args, kwargs = tree_unflatten(list(range(len(self.constants))), self.spec)
        for pos, value in enumerate(args):
            if value == index:
                return f"argument {pos}"
        for key, value in kwargs.items():
            if value == index:
                return repr(key)
        return f"leaf {index}"

    def step(self, d: int, g: int) -> list[torch.Tensor]:
        """The inputs of accumulation step ``g`` of iteration ``d``: leaves ``[R, b, ...]``."""
        return [t[d, g] for t in self.batched]

    def replica_call(self, d: int, g: int, replica: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Replica ``replica``'s call (arguments, keywords) for accumulation step ``g`` of ``d``."""
        return self.rebuild([t[d, g, replica] for t in self.batched])

    def rebuild(self, batched: Sequence[torch.Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        leaves = list(self.constants)
        for i, t in zip(self.batched_index, batched, strict=True):
            leaves[i] = t
        if self.spec is None:
            return tuple(leaves), {}
        args, kwargs = tree_unflatten(leaves, self.spec)
        return tuple(args), dict(kwargs)


def _each_tensor(tree: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` over the tensors of a model's outputs (raises on a leaf that is not one)."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if type(tree) in (tuple, list) and all(isinstance(x, torch.Tensor) for x in tree):
        return type(tree)(fn(x) for x in tree)  # the common (output, loss): no pytree walk

    def one(x: Any) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise ExecutorError(
                f"model outputs must be tensors (or tuples/lists/dicts of tensors); got "
                f"{type(x).__name__}"
            )
        return fn(x)

    return tree_map(one, tree)


def detach(tree: Any) -> Any:
    return _each_tensor(tree, torch.Tensor.detach)


def _own(x: torch.Tensor) -> torch.Tensor:
    """``x`` detached; copied unless autograd made its memory in this forward (``x``, or the
    tensor it is a view of, has a ``grad_fn``). Inputs, parameters, buffers and views of them
    are copied, so an output never changes with a later update or with what the caller does
    to its inputs."""
    base = x._base if x._is_view() else x
    if base is not None and base.grad_fn is not None:
        return x.detach()
    return x.detach().clone()


def detach_own(tree: Any) -> Any:
    """:func:`detach`, for outputs returned without :func:`stack` (which copies): see
    :func:`_own`."""
    return _each_tensor(tree, _own)


def stack(outputs: Sequence[Any]) -> Any:
    """Per-replica outputs → one pytree with a leading replica dimension."""
    flat = [tree_flatten(o) for o in outputs]
    columns = zip(*(leaves for leaves, _ in flat), strict=True)
    return tree_unflatten([torch.stack(c) for c in columns], flat[0][1])
