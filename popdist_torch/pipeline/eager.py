"""Stage a model at its block boundaries while it runs eagerly (what torch.fx cannot trace).

The forward runs as the user wrote it, on the caller's thread: keyword inputs, dict and
``ModelOutput`` outputs, Python control flow on tensor values, buffers sliced by run-time
lengths and attributes set in forward all behave as in plain torch.  Stages come from
module boundaries, as PopTorch assigns them: a forward pre-hook on every ``BeginBlock``
module and every ``Block`` context make their block current, and everything that runs
until the next boundary belongs to it (what runs before the first boundary belongs to the
first block).  The first forward of a call signature discovers the blocks in order and,
through a ``TorchFunctionMode``, which block uses each parameter; the stages, devices and
shared weights are then checked exactly as for a traced model (``stages.resolve_stages``,
``check_devices``, ``check_shared_parameters``).

Each micro-batch runs its stages in order, forward then backward (one autograd pass:
gradients of a weight shared by stages sum from every use, as in plain torch).  The stages
do not overlap: on a CPU a forward that Python drives cannot be cut between threads without
locks that a block re-entered would deadlock on.  Each stage computes with its device's share
of torch's intra-op threads, as on the traced path (the runner sets it around the step).
The profile still shows each stage's forward (the span between its boundaries) and
backward (until the gradient reaches the first activation the stage took, marked while
recording).

A ``BeginBlock`` module whose output the first forward passed to ``recomputationCheckpoint``
(as applications do from a forward hook on each layer) runs under
``torch.utils.checkpoint`` in training from then on: its activations are recomputed in
backward instead of kept (modules with running statistics excepted), the numbers unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.checkpoint import checkpoint
from torch.utils.hooks import RemovableHandle

from popdist_torch.errors import PipelineError
from popdist_torch.pipeline.blocks import (
    ExecutionStrategy,
    begin_block_of,
    enter_block,
    trace_state,
)
from popdist_torch.pipeline.stages import (
    WHOLE_MODEL,
    ParameterUsers,
    StageSpec,
    check_devices,
    check_shared_parameters,
    resolve_stages,
)
from popdist_torch.surface.loss import find_loss, watching_losses

Call = tuple[tuple[Any, ...], dict[str, Any]]
Recorder = Callable[[StageSpec, str, int, float, float], None]


@dataclass
class EagerPlan:
    """The stages of an eagerly staged model: its blocks, in forward order, and their stages."""

    stages: list[StageSpec]
    block_order: list[str]
    stage_of_block: dict[str, int]
    recompute: list[nn.Module] = field(default_factory=list)  # checkpointed BeginBlock modules

    def active(self) -> list[StageSpec]:
        """Every stage (a stage of the eager path always ran)."""
        return self.stages


class _ParameterUse(TorchFunctionMode):
    """Records which block each parameter is used in (the discovering forward only)."""

    def __init__(self) -> None:
        super().__init__()
        self.uses: dict[int, tuple[nn.Parameter, set[str | None]]] = {}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        for leaf in tree_leaves((list(args), dict(kwargs))):
            if isinstance(leaf, nn.Parameter):
                self.uses.setdefault(id(leaf), (leaf, set()))[1].add(trace_state.current)
        return func(*args, **kwargs)


class _EntryMarks(TorchFunctionMode):
    """Marks, for the profile, when the gradient reaches each block's first input.

    The first operation of a block that takes an activation (a tensor computed earlier, not
    a parameter or the data) gets a gradient hook on it: in backward it fires once the block
    is done, which ends that block's backward span. Active only while recording.
    """

    def __init__(self, arrived: dict[str, float]) -> None:
        super().__init__()
        self.arrived = arrived
        self.marked: set[str] = set()

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        block = trace_state.current
        if block is not None and block not in self.marked and torch.is_grad_enabled():
            for value in tree_leaves((list(args), dict(kwargs))):
                if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                    self.marked.add(block)
                    value.register_hook(self._arrived(block))  # type: ignore[no-untyped-call]
                    break
        return func(*args, **kwargs)

    def _arrived(self, block: str) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            self.arrived[block] = max(self.arrived.get(block, 0.0), time.perf_counter())

        return hook


class _StagedForward:
    """One eager forward under staging: the boundaries' hooks, the blocks it went through."""

    def __init__(
        self,
        model: nn.Module,
        *,
        discover: bool,
        backward_marks: bool,
        recompute: Sequence[nn.Module] = (),
    ) -> None:
        self.model = model
        self.uses = _ParameterUse() if discover else None
        self.backward_marks = backward_marks
        self.recompute = recompute
        self.outputs: dict[int, nn.Module] = {}  # id of a BeginBlock module's output tensor
        self.checkpointed: set[int] = set()
        self.own_forward: list[Any] = []  # a forward set on the instance, put back after
        self.handles: list[RemovableHandle] = []
        self.marks: _EntryMarks | None = None
        self.sequence: list[tuple[str, float]] = []
        self.blocks: dict[str, int | None] = {}
        self.entry_grads: dict[str, float] = {}  # block -> when its input's gradient arrived
        self.start = self.end = 0.0

    def __enter__(self) -> _StagedForward:
        state = trace_state
        state.reset()
        state.tracing = True  # Block contexts now enter their block
        for module in self.model.modules():
            mark = begin_block_of(module)
            if mark is not None:
                self.handles.append(module.register_forward_pre_hook(self._boundary(mark)))
                if self.uses is not None:
                    self.handles.append(module.register_forward_hook(self._output))
        for module in self.recompute:
            self.own_forward.append(vars(module).get("forward"))
            module.forward = _recomputed(module.forward)
        if self.uses is not None:
            state.checkpointed = self.checkpointed
            self.uses.__enter__()  # type: ignore[no-untyped-call]
        self.marks = _EntryMarks(self.entry_grads) if self.backward_marks else None
        if self.marks is not None:
            self.marks.__enter__()  # type: ignore[no-untyped-call]
        self.start = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end = time.perf_counter()
        if self.marks is not None:
            self.marks.__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]
        if self.uses is not None:
            self.uses.__exit__(exc_type, exc, tb)  # type: ignore[no-untyped-call]
        for handle in self.handles:
            handle.remove()
        for module, own in zip(self.recompute, self.own_forward, strict=True):
            del module.forward
            if own is not None:
                module.forward = own
        self.sequence = list(trace_state.sequence)
        self.blocks = dict(trace_state.blocks)
        trace_state.reset()

    def _boundary(self, mark: tuple[str | None, int | None]) -> Callable[..., None]:
        user_id, ipu_id = mark

        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            name = user_id if user_id is not None else (None if ipu_id is None else f"ipu{ipu_id}")
            enter_block(name, ipu_id)

        return hook

    def _output(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        for value in tree_leaves(output):
            if isinstance(value, torch.Tensor):
                self.outputs[id(value)] = module

    def checkpointed_modules(self) -> list[nn.Module]:
        """The ``BeginBlock`` modules whose outputs went through ``recomputationCheckpoint``
        (directly or from a forward hook), except those that update running statistics."""
        found = {id(m): m for key, m in self.outputs.items() if key in self.checkpointed}
        return [m for m in found.values() if not _has_running_stats(m)]

    def order(self) -> list[str]:
        """The blocks in the order they were first entered (the whole model if none)."""
        return list(self.blocks) or [WHOLE_MODEL]


def _recomputed(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` whose activations are recomputed in backward rather than kept."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def _has_running_stats(module: nn.Module) -> bool:
    return any(
        isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats
        for m in module.modules()
    )


def make_plan(
    strategy: ExecutionStrategy | None, seen: _StagedForward, num_devices: int
) -> EagerPlan:
    """The stages of ``strategy`` for the blocks ``seen`` discovered; checked as traced ones."""
    order = seen.order()
    specs = resolve_stages(strategy, order, seen.blocks)
    check_devices(specs, num_devices)
    stage_of = {b: s.index for s in specs for b in s.blocks}
    users: ParameterUsers = {}
    assert seen.uses is not None
    for key, (param, blocks) in seen.uses.uses.items():
        users[key] = (param, {stage_of[b if b is not None else order[0]] for b in blocks})
    check_shared_parameters(users, specs)
    return EagerPlan(specs, order, stage_of, seen.checkpointed_modules())


def _stage_spans(plan: EagerPlan, seen: _StagedForward) -> dict[int, tuple[float, float]]:
    """Each stage's forward span; checks the forward went through the stages in order."""
    marks = list(seen.sequence) or [(plan.block_order[0], seen.start)]
    spans: dict[int, tuple[float, float]] = {}
    previous: tuple[str, int] | None = None
    for i, (block, start) in enumerate(marks):
        if block not in plan.stage_of_block:
            raise PipelineError(
                f"block {block!r} ran in a later micro-batch but not in the first one, "
                f"whose blocks were {', '.join(repr(b) for b in plan.block_order)}: give the "
                "strategy's stages explicitly, or enter every block on each call"
            )
        stage = plan.stage_of_block[block]
        if previous is not None and stage < previous[1]:
            raise PipelineError(
                f"block {block!r} (stage {stage}) runs after block {previous[0]!r} "
                f"(stage {previous[1]}): activations would go backwards; list the stages in "
                "forward order (blocks that return to an earlier ipu_id: "
                "PipelinedExecution(AutoStage.AutoIncrement))"
            )
        previous = (block, stage)
        begin = seen.start if i == 0 else start
        end = marks[i + 1][1] if i + 1 < len(marks) else seen.end
        first = spans.get(stage, (begin, end))[0]
        spans[stage] = (first, end)
    return spans


def detached(output: Any) -> Any:
    """The output with every tensor detached (other leaves as they are)."""
    return tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, output)


class EagerStages:
    """Runs a model's micro-batches eagerly, stage by stage, for one call signature."""

    def __init__(
        self,
        model: nn.Module,
        strategy: ExecutionStrategy | None,
        num_devices: int,
        on_plan: Callable[[EagerPlan], None],
    ) -> None:
        self.model = model
        self.strategy = strategy
        self.num_devices = num_devices
        self.on_plan = on_plan  # the runner fixes its devices and checks the depth
        self.plan: EagerPlan | None = None

    def run(
        self,
        calls: Sequence[Call],
        *,
        training: bool,
        grad_scale: float,
        record: Recorder | None,
        device: torch.device,
        check: Callable[[int], None],
    ) -> list[Any]:
        """Forward (and backward) of every micro-batch, in turn; detached outputs.

        ``check`` gets the number of stages before the first backward (the pipeline's depth).
        """
        outputs = []
        for m, (args, kwargs) in enumerate(calls):
            if device.type != "cpu":
                args, kwargs = tree_map(lambda v: _to(v, device), (args, kwargs))
            with (
                _StagedForward(
                    self.model,
                    discover=self.plan is None,
                    backward_marks=record is not None,
                    recompute=self.plan.recompute if self.plan is not None and training else (),
                ) as seen,
                torch.set_grad_enabled(training),
                watching_losses() as marks,
            ):
                out = self.model(*args, **kwargs)
            if self.plan is None:
                self.plan = make_plan(self.strategy, seen, self.num_devices)
                self.on_plan(self.plan)
            spans = _stage_spans(self.plan, seen)
            if m == 0:
                check(len(self.plan.stages))
            if training:
                loss = find_loss(out, marks, error=PipelineError)  # the executor's rule
                start = time.perf_counter()
                loss.backward(torch.full_like(loss, grad_scale))  # type: ignore[no-untyped-call]
                if record is not None:
                    self._record_backward(seen, spans, record, m, start)
            if record is not None:
                for stage, (begin, end) in spans.items():
                    record(self.plan.stages[stage], "F", m, begin, end)
            outputs.append(detached(out))
        return outputs

    def _record_backward(
        self,
        seen: _StagedForward,
        spans: dict[int, tuple[float, float]],
        record: Recorder,
        m: int,
        start: float,
    ) -> None:
        """Each stage's backward: until the gradient reached its first block's input."""
        assert self.plan is not None
        end = time.perf_counter()
        arrived: dict[int, float] = {}
        for block, when in seen.entry_grads.items():
            stage = self.plan.stage_of_block.get(block, 0)
            arrived[stage] = max(arrived.get(stage, 0.0), when)
        begin = start
        stages = sorted(spans)
        for stage in reversed(stages):
            finish = end if stage == stages[0] else arrived.get(stage)
            if finish is None:
                continue  # no gradient marks this boundary: its time goes to the stage before
            record(self.plan.stages[stage], "B", m, begin, finish)
            begin = finish


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value
