"""Deterministic gradient reduction: the same sum, bit for bit, whatever the replica split.

Opt-in (``poprun --deterministic-reduction`` or ``opts.Training.deterministicReduction()``).
The default path sums local replicas inside one ``vmap`` backward and then lets the
backend's allreduce add the instances' sums in an order of its own, so the bits of the
result depend on how replicas are spread over instances. Here:

1. each replica runs on its own (never a ``vmap`` over 2 or 3 replicas, whose kernels may
   differ), on a copy of its micro-batch (a view's alignment depends on the split), and its
   backward writes a gradient of its own, its micro-batch loss scaled by
   ``1 / (accumulation × total replicas)`` (Mean) or 1 (Sum), a factor the split does not
   change; accumulation steps add into that replica's row in step order;
2. the instances gather every replica's row in global replica order (padded to the largest
   instance's count, so both backends gather equal shapes, then unpadded);
3. every instance adds the rows one after the other, replica 0 first: element by element,
   so the same bits on every instance and for every split.

The intra-op thread count is part of what decides a replica's bits on CPU: in this mode the
executor pins it to 1 unless the user chose a thread count
(:func:`popdist.env.read_compute_threads`). The cost is one backward per replica instead of one per
step, and a gather of ``replicas × parameters`` values instead of an allreduce of
``parameters`` (``benchmarks/deterministic.py`` measures it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from popdist.collectives.base import Collectives
from popdist_torch.execution.batch import Batch, detach, stack
from popdist_torch.execution.outputs import OutputCollector
from popdist_torch.execution.runners import ReplicaRunner
from popdist_torch.surface.loss import backward_loss, find_loss, watching_losses

__all__ = ["DeterministicReplicaRunner", "ReplicaGradients"]


def _own_memory(inputs: Sequence[torch.Tensor], replica: int) -> list[torch.Tensor]:
    """``replica``'s micro-batch, copied to memory of its own.

    A view into the combined batch starts at an address that depends on the replica's place
    in it, so on the split, and a replica's gradient was seen to differ in its last bits
    between 1 × 6 and 2 × 3 from that alone (vectorised CPU kernels may treat an unaligned
    head apart). A copy starts aligned, the same for every split.
    """
    return [t[replica].clone(memory_format=torch.contiguous_format) for t in inputs]


class ReplicaGradients:
    """One weight update's gradients kept per local replica, summed in global replica order.

    ``counts``: every instance's local replicas, in instance order; ``rank``: this
    instance's index; ``collectives``: ``None`` for one instance alone.
    """

    def __init__(
        self,
        collectives: Collectives | None,
        named_parameters: Iterable[tuple[str, nn.Parameter]],
        counts: Sequence[int],
        rank: int,
    ) -> None:
        self._collectives = collectives
        self._params = [p for _, p in named_parameters if p.requires_grad]
        self._counts = tuple(counts)
        self._rank = rank
        self._rows: torch.Tensor | None = None

    @property
    def local(self) -> int:
        """This instance's replicas."""
        return self._counts[self._rank]

    def _flat(self) -> torch.Tensor:
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in self._params
        ]
        return torch.cat(parts) if parts else torch.zeros(0)

    def take(self, replica: int, *, first: bool) -> None:
        """Move what the last backward left in ``.grad`` into ``replica``'s row.

        ``first``: the update's first accumulation step (the row starts from it); later
        steps add into the row, in step order. ``.grad`` is left empty for the next replica.
        """
        flat = self._flat()
        if self._rows is None or self._rows.shape[1] != flat.numel():
            self._rows = torch.zeros(
                max(self._counts), flat.numel(), dtype=flat.dtype, device=flat.device
            )
        if first:
            self._rows[replica].copy_(flat)
        else:
            self._rows[replica].add_(flat)
        for p in self._params:
            p.grad = None

    def finish(self) -> None:
        """Gather every replica's row, add them in global order, leave the sum in ``.grad``."""
        assert self._rows is not None, "take() was never called in this update"
        rows = self._gathered(self._rows)
        total = rows[0].clone()
        for r in range(1, rows.shape[0]):
            total.add_(rows[r])
        offset = 0
        for p in self._params:
            n = p.numel()
            p.grad = total[offset : offset + n].view_as(p).to(p.dtype).clone()
            offset += n

    def _gathered(self, rows: torch.Tensor) -> torch.Tensor:
        """Every replica's row, in global replica order (this instance's rows padded)."""
        width = max(self._counts)
        if self._collectives is None or len(self._counts) == 1:
            return rows[: self.local]
        with self._collectives.waited_next():
            every = self._collectives.allgather(rows, name="popdist_torch.replica_grads")
        every = every.view(len(self._counts), width, -1)
        return torch.cat([every[i, :count] for i, count in enumerate(self._counts)])


class DeterministicReplicaRunner(ReplicaRunner):
    """Replicas one after the other, each into its own gradient row (:class:`ReplicaGradients`).

    The executor gives each micro-batch loss the split-independent ``scale``; this runner
    never uses the default :class:`~popdist_torch.execution.reducer.GradientReducer`.
    """

    def __init__(self, model: nn.Module, gradients: ReplicaGradients) -> None:
        super().__init__(model, None)
        self.gradients = gradients

    def forward_backward(
        self, batch: Batch, iteration: int, *, scale: float, collector: OutputCollector
    ) -> None:
        for g in range(batch.accumulation):
            keep = collector.wants(iteration, g)
            inputs = batch.step(iteration, g)
            outputs = []
            for i in range(inputs[0].shape[0]):
                args, kwargs = batch.rebuild(_own_memory(inputs, i))
                with watching_losses() as marks:
                    out = self.model(*args, **kwargs)
                backward_loss(find_loss(out, marks), scale)
                self.gradients.take(i, first=g == 0)
                if keep:
                    outputs.append(detach(out))
            if keep:
                collector.add(iteration, g, stack(outputs))
        self.gradients.finish()

    def forward(self, batch: Batch, iteration: int, collector: OutputCollector) -> None:
        inputs = batch.step(iteration, 0)
        outputs = []
        for i in range(inputs[0].shape[0]):
            args, kwargs = batch.rebuild(_own_memory(inputs, i))
            outputs.append(detach(self.model(*args, **kwargs)))
        collector.add(iteration, 0, stack(outputs))
