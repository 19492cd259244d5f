"""The fused training micro-step, captured in a graph once per input signature, then replayed.

The local replicas' runner hands its training calls here when the plan allows a capture
(:func:`~popdist_torch.execution.capture.eligibility.plan_refusal`). A call's *signature*
is what a replay cannot change: its inputs' per-step shapes, types and devices, its other
arguments, the tree they form. Per signature:

1. *warm-up*: its first :data:`WARMUP_CALLS` calls run today's eager fused step (on the
   graph backend's side stream), so the warm-up adds no computation and draws no extra
   random number; the first micro-step of each signature's warm-up under a new guard is
   watched (:class:`~.facts.StepWatch`, and the hooks then registered): a step that a
   replay would not repeat turns capturing off for good, with one log line;
2. *capture*: the next call's first micro-step copies its inputs into static buffers and
   is captured (forward and backward, the losses' gradient seeded from a device tensor
   holding the scale, so a new scale is data, not a new graph). The parameters' ``.grad``
   exist before the capture, as zeroed buffers for those that got a gradient in the
   warm-up only (an unused parameter's stays ``None``), so backward accumulates in place;
3. *replay*, for every later micro-step: each weight update points ``.grad`` at those
   buffers and zeroes them (``0 + g`` is ``g``, bit for bit), each micro-step copies its
   inputs in and replays, and the kept outputs are copied out of the static ones. The
   optimizer steps eagerly, as today, so any optimizer and scheduler works unchanged.

Before a replay a *guard* compares what the graph baked in: the parameters' addresses and
``requires_grad``, the buffers' addresses, every module's train mode, the number of hooks; a
change (or autocast, or grad mode off) runs that call eagerly and warms it up again, watched,
and a stable new signature is captured again. At
most :data:`CACHED_GRAPHS` graphs are kept (an epoch's short last batch has its own). A
failed capture runs the step eagerly from then on, with one log line. Python state that
``forward`` reads (an attribute, a counter) is frozen at the capture: PopTorch's static
graph semantics.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from popdist_torch.execution.batch import Batch
from popdist_torch.execution.capture.eligibility import StepFacts, step_refusal
from popdist_torch.execution.capture.facts import StepWatch, hook_count, hooks_of
from popdist_torch.execution.capture.seam import Graph, GraphBackend

__all__ = ["CACHED_GRAPHS", "NOT_RUN", "WARMUP_CALLS", "GraphedSteps"]

log = logging.getLogger("popdist_torch.execution.executor")

#: Eager calls of a signature before it is captured.
WARMUP_CALLS = 2
#: Captured graphs kept, the least recently used dropped first.
CACHED_GRAPHS = 4
#: :meth:`GraphedSteps.step`'s answer when it did not run the step (a capture failed).
NOT_RUN = object()

#: The runner's fused micro-step on given inputs, the losses' gradient seeded from a device
#: tensor holding the scale; returns the detached outputs. The captured step is the eager one.
FusedStep = Callable[[list[torch.Tensor], torch.Tensor], Any]
Signature = tuple[Any, ...]


class _Captured:
    """One captured micro-step: the graph, its static buffers, what it baked in."""

    def __init__(
        self,
        graph: Graph,
        inputs: list[torch.Tensor],
        scale: torch.Tensor,
        outputs: Any,
        guard: tuple[Any, ...],
        grads: tuple[int, ...],
    ) -> None:
        self.graph, self.inputs, self.scale, self.outputs = graph, inputs, scale, outputs
        self.scale_value = float("nan")  # the scale the device tensor holds (set at capture)
        self.guard, self.grads = guard, grads


class GraphedSteps:
    """Warm-up, capture, guards and replay of ``model``'s fused micro-step on ``backend``."""

    def __init__(self, model: nn.Module, backend: GraphBackend) -> None:
        self._model = model
        self._backend = backend
        self._params = list(model.parameters())
        self._modules = list(model.modules())
        self._graphs: OrderedDict[Signature, _Captured] = OrderedDict()
        self._warm: dict[Signature, tuple[tuple[Any, ...], int]] = {}  # guard, eager calls
        self._grads_seen: dict[Signature, tuple[int, ...]] = {}
        self._buffers: dict[int, torch.Tensor] = {}  # parameter index -> its .grad buffer
        self._watched: dict[Signature, tuple[Any, ...]] = {}  # the guard its warm-up was watched
        self._watch: tuple[Any, ...] | None = None  # set: this call's first micro-step is watched
        self.off: str | None = None  #: why steps run eagerly for good (None: they may replay)
        self._key: Signature | None = None
        self._now: _Captured | None = None  # the graph this call replays
        self._capture_guard: tuple[Any, ...] | None = None  # set: this call captures
        self._warming = False

    @property
    def backend(self) -> GraphBackend:
        return self._backend

    @property
    def replaying(self) -> bool:
        """Whether this call's micro-steps replay (or capture) instead of running eagerly."""
        return self._now is not None or self._capture_guard is not None

    # -- per call ---------------------------------------------------------------------
    def begin_call(self, batch: Batch, *, fused: bool) -> None:
        """Choose how this call runs: replay its signature's graph, capture it, or eagerly
        (a warm-up, a failed guard); ``fused``: the replicas are known to run as one vmap."""
        self._now, self._capture_guard, self._warming, self._watch = None, None, False, None
        key = self._signature(batch)
        if self.off is not None or key is None:
            return
        # read again each call: a parameter or submodule rebound (load_state_dict(assign=True))
        self._params = list(self._model.parameters())
        self._modules = list(self._model.modules())
        self._key, guard = key, self._guard(batch)
        captured = self._graphs.get(key)
        if captured is not None:
            if captured.guard == guard:
                self._graphs.move_to_end(key)
                self._now = captured
                return
            del self._graphs[key]  # a parameter moved, a mode or a hook changed: warm up again
        seen, count = self._warm.get(key, (guard, 0))
        if seen != guard:  # warm-up calls count under the guard the capture will bake in
            count = 0
        watched = self._watched.get(key) == guard  # a new signature, hook, mode: watched again
        if fused and watched and count >= WARMUP_CALLS and key in self._grads_seen:
            self._capture_guard = guard
            return
        self._warm[key] = (guard, count + 1)
        self._warming = True
        self._watch = None if watched else guard

    def _signature(self, batch: Batch) -> Signature | None:
        """What a replay of this call's micro-steps cannot change (None: no graph this call)."""
        batched = batch.batched_index
        others = [c for i, c in enumerate(batch.constants) if i not in batched]
        if any(isinstance(c, torch.Tensor) for c in others):
            self.refuse(StepFacts(tensor_arguments=True))
            return None
        steps = tuple((t.shape[2:], t.dtype, t.device) for t in batch.batched)
        key = (batch.spec, tuple((type(c), c) for c in others), steps)
        try:
            hash(key)
        except TypeError:  # an argument that cannot be compared: eagerly
            return None
        return key

    def _guard(self, batch: Batch) -> tuple[Any, ...]:
        device = batch.batched[0].device.type
        return (
            tuple((p.data_ptr(), p.requires_grad) for p in self._params),
            tuple(b.data_ptr() for b in self._model.buffers()),  # a buffer rebound (mask = ...)
            tuple(m.training for m in self._modules),
            hook_count(self._modules, self._params),
            torch.is_grad_enabled(),
            torch.is_autocast_enabled(device),
        )

    # -- per weight update --------------------------------------------------------------
    def begin_update(self) -> None:
        """Point ``.grad`` at the static buffers and zero them (a replayed or captured call)."""
        if self._now is not None:
            grads = self._now.grads
        else:
            assert self._key is not None
            grads = self._grads_seen[self._key]
        buffers = []
        for i in grads:
            param = self._params[i]
            buffer = self._buffers.get(i)
            if buffer is None or not _fits(buffer, param):  # new shape, dtype (half()), device
                buffer = self._buffers[i] = torch.zeros_like(param)
            param.grad = buffer
            buffers.append(buffer)
        if buffers:
            torch._foreach_zero_(buffers)

    def end_update(self) -> None:
        """After a warm-up update: which parameters got a gradient (they get buffers)."""
        if self._warming and self._key is not None:
            self._grads_seen[self._key] = tuple(
                i for i, p in enumerate(self._params) if p.grad is not None
            )

    # -- per micro-step -------------------------------------------------------------------
    @contextlib.contextmanager
    def warming(self) -> Iterator[None]:
        """Around a warm-up's eager fused step: the backend's stream; the first micro-step of a
        signature's warm-up under a new guard watched."""
        if not self._warming:
            yield
            return
        guard, self._watch = self._watch, None
        watch = None if guard is None else StepWatch()
        with self._backend.warming(), watch if watch is not None else contextlib.nullcontext():
            yield
        if watch is not None:
            assert self._key is not None and guard is not None
            self._watched[self._key] = guard
            facts = StepFacts(
                random_ops=tuple(watch.random_ops),
                data_dependent_ops=tuple(watch.data_dependent_ops),
                saved_tensor_hooks=watch.saved_tensor_hooks,
                hooks=hooks_of(self._model),
            )
            self.refuse(facts)

    def step(self, inputs: list[torch.Tensor], scale: float, keep: bool, run: FusedStep) -> Any:
        """One micro-step of a replayed call: the outputs when ``keep`` (copied out of the
        static ones), else None; :data:`NOT_RUN` when its capture failed."""
        captured = self._now
        if captured is None:
            captured = self._capture(inputs, scale, run)
            if captured is None:
                return NOT_RUN
        else:
            for static, value in zip(captured.inputs, inputs, strict=True):
                static.copy_(value)
            if scale != captured.scale_value:
                captured.scale.fill_(scale)
                captured.scale_value = scale
            captured.graph.replay()
        return _cloned(captured.outputs) if keep else None

    def _capture(
        self, inputs: list[torch.Tensor], scale: float, run: FusedStep
    ) -> _Captured | None:
        assert self._key is not None and self._capture_guard is not None
        key, guard = self._key, self._capture_guard
        statics = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in inputs]
        for static, value in zip(statics, inputs, strict=True):
            static.copy_(value)
        seed = torch.full((), scale, dtype=torch.float64, device=inputs[0].device)
        grads = self._grads_seen[key]
        watched = [self._params[i] for i in grads]
        model = self._model

        def addresses() -> tuple[int, ...]:
            held = [p.grad.data_ptr() if p.grad is not None else 0 for p in watched]
            weights = [t.data_ptr() for t in (*model.parameters(), *model.buffers())]
            return (*(t.data_ptr() for t in statics), seed.data_ptr(), *held, *weights)

        try:
            graph, outputs = self._backend.capture(lambda: run(statics, seed), addresses)
        except Exception as exc:
            self._fail(exc)
            return None
        captured = _Captured(graph, statics, seed, outputs, guard, grads)
        captured.scale_value = scale
        self._graphs[key] = captured
        while len(self._graphs) > CACHED_GRAPHS:
            self._graphs.popitem(last=False)
        self._now, self._capture_guard = captured, None
        return captured

    # -- eager for good ---------------------------------------------------------------------
    def refuse(self, facts: StepFacts) -> None:
        """Turn capturing off for good if ``facts`` say a replay would differ (one log line)."""
        reason = step_refusal(facts)
        if reason is not None and self.off is None:
            log.info("the training micro-step runs eagerly, not captured in a graph: %s", reason)
            self._stop(reason)

    def _fail(self, exc: Exception) -> None:
        reason = f"its capture failed ({type(exc).__name__}: {exc})"
        log.warning("the training micro-step runs eagerly from now on: %s", reason)
        self._stop(reason)

    def _stop(self, reason: str) -> None:
        self.off = reason
        self._graphs.clear()
        self._buffers.clear()
        self._now, self._capture_guard, self._warming = None, None, False


def _fits(buffer: torch.Tensor, param: torch.Tensor) -> bool:
    """Whether ``buffer`` can be ``param``'s ``.grad``, laid out as a fresh gradient would be."""
    return (
        buffer.shape == param.shape
        and buffer.dtype == param.dtype
        and buffer.device == param.device
        and buffer.stride() == param.stride()
    )


def _cloned(tree: Any) -> Any:
    """Copies of the static outputs (the next replay rewrites them)."""
    if isinstance(tree, torch.Tensor):
        return tree.clone()
    if type(tree) in (tuple, list):
        return type(tree)(_cloned(x) for x in tree)
    return tree_map(torch.clone, tree)
