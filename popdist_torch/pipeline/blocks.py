"""Block annotations, stages and execution strategies (the PopTorch names).

Re-exported by :mod:`popdist_torch.pipeline`; kept apart so the splitter and the
runner can import them without a cycle.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Literal, TypeVar

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from popdist_torch.enums import AutoStage, Liveness
from popdist_torch.errors import PipelineError

_BEGIN_BLOCK_ATTR = "_popdist_begin_block"


class _TraceState(threading.local):
    """Per-thread record of the block the forward being traced is in."""

    def __init__(self) -> None:
        self.tracing = False
        self.current: str | None = None
        self.inside_context: str | None = None
        self.blocks: dict[str, int | None] = {}
        # (block, time.perf_counter()) at each change of block: an eager forward's profile
        self.sequence: list[tuple[str, float]] = []
        # Tensors passed to recomputationCheckpoint in an eager forward being discovered.
        self.checkpointed: set[int] | None = None
        self.unnamed = 0
        self.auto_ids = False
        # Eager forward watched by the executor (no strategy set): see ``watch_blocks``.
        self.watching = False
        self.unplaced_seen = False

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


trace_state = _TraceState()


class BlocksPlaced(BaseException):
    """Raised out of an eager forward at its first ``Block(ipu_id=...)`` while watched.

    A ``BaseException`` so that a model's own ``except Exception`` does not swallow it:
    the executor catches it, builds the auto-staged runner and runs the call again.
    """


@contextmanager
def watch_blocks() -> Iterator[_TraceState]:
    """Watch an eager forward for ``Block`` contexts (the executor's first call).

    Inside, a ``Block`` with an ``ipu_id`` raises :class:`BlocksPlaced` (PopTorch stages
    such a model: the caller switches to ``PipelinedExecution(AutoStage.SameAsIpu)``); a
    ``Block`` without one sets ``unplaced_seen`` (the caller warns once).
    """
    state = trace_state
    state.watching, state.unplaced_seen = True, False
    try:
        yield state
    finally:
        state.watching = False


def note_checkpoint(values: Any) -> None:
    """Note the tensors ``recomputationCheckpoint`` was given (eager staging recomputes
    the ``BeginBlock`` modules whose outputs were checkpointed)."""
    seen = trace_state.checkpointed
    if seen is not None:
        seen.update(id(v) for v in tree_leaves(values) if isinstance(v, torch.Tensor))


def _block_name(user_id: str | None, ipu_id: int | None) -> str | None:
    """Name of a block: its user id, else ``ipu<N>`` for an ``ipu_id``-only block."""
    if user_id is not None:
        return str(user_id)
    if ipu_id is not None:
        return f"ipu{ipu_id}"
    return None


def _check_ipu_id(ipu_id: int | None, what: str) -> None:
    if ipu_id is not None and (
        isinstance(ipu_id, bool) or not isinstance(ipu_id, int) or ipu_id < 0
    ):
        raise PipelineError(f"{what}: ipu_id={ipu_id!r} must be a non-negative integer")


def enter_block(name: str | None, ipu_id: int | None) -> str:
    """Make ``name`` the current block of the trace; returns the resolved name."""
    state = trace_state
    if name is None:
        name = str(state.unnamed) if state.auto_ids else f"block{state.unnamed}"
        state.unnamed += 1
    known = state.blocks.get(name, ipu_id)
    if name in state.blocks and ipu_id is not None and known is not None and known != ipu_id:
        raise PipelineError(
            f"block {name!r} is placed on ipu_id {known} and on ipu_id {ipu_id}; "
            "give each block a single ipu_id"
        )
    state.blocks[name] = ipu_id if ipu_id is not None else state.blocks.get(name)
    if state.current != name:
        state.sequence.append((name, time.perf_counter()))
    state.current = name
    return name


class Block:
    """Context manager: modules called and operations run inside it form one block.

    ``Block("B1")`` names the block; ``Block(ipu_id=0)`` places it on device 0 (and
    names it ``ipu0``).  Blocks do not nest.  Outside of stage splitting it does nothing,
    so an annotated model still runs as a plain ``nn.Module``.
    """

    def __init__(self, user_id: str | None = None, ipu_id: int | None = None) -> None:
        _check_ipu_id(ipu_id, f"Block({user_id!r})")
        self.user_id = user_id
        self.ipu_id = ipu_id

    @staticmethod
    def useAutoId() -> None:
        """Restart the automatic names of unnamed blocks (PopTorch's ``Block.useAutoId``).

        Call it at the top of ``forward``: unnamed, unplaced blocks are then named
        ``"0"``, ``"1"``... in the order they are entered.
        """
        state = trace_state
        if state.tracing:
            state.unnamed = 0
            state.auto_ids = True

    def __enter__(self) -> Block:
        state = trace_state
        if state.watching:
            if self.ipu_id is not None:
                raise BlocksPlaced()
            state.unplaced_seen = True
        if state.tracing:
            if state.inside_context is not None:
                raise PipelineError(
                    f"Block({self.user_id!r}) opened inside Block({state.inside_context!r}); "
                    "blocks do not nest: close the outer block first"
                )
            state.inside_context = enter_block(_block_name(self.user_id, self.ipu_id), self.ipu_id)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if trace_state.tracing:
            trace_state.inside_context = None


def BeginBlock(
    module: nn.Module, user_id: str | None = None, ipu_id: int | None = None
) -> nn.Module:
    """Start a block at ``module``: it and every later call in forward order join it.

    Returns ``module`` itself, marked; the block lasts until the next ``BeginBlock``
    module or ``Block`` context.
    """
    if not isinstance(module, nn.Module):
        raise PipelineError(
            f"BeginBlock expects an nn.Module, got {type(module).__name__}; "
            "wrap a layer: BeginBlock(nn.Linear(...), 'B1')"
        )
    _check_ipu_id(ipu_id, f"BeginBlock(..., {user_id!r})")
    setattr(module, _BEGIN_BLOCK_ATTR, (user_id, ipu_id))
    return module


_F = TypeVar("_F", bound=Callable[..., Any])


def BlockFunction(user_id: str | None = None, ipu_id: int | None = None) -> Callable[[_F], _F]:
    """Decorator: every call of the function runs inside ``Block(user_id, ipu_id)``."""
    _check_ipu_id(ipu_id, f"BlockFunction({user_id!r})")

    def decorator(func: _F) -> _F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with Block(user_id, ipu_id):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator


def removeBlocks(module: nn.Module) -> nn.Module:
    """Remove the ``BeginBlock`` marks of ``module`` and its submodules; returns it."""
    if not isinstance(module, nn.Module):
        raise PipelineError(f"removeBlocks expects an nn.Module, got {type(module).__name__}")
    for m in module.modules():
        if begin_block_of(m) is not None:
            delattr(m, _BEGIN_BLOCK_ATTR)
    return module


def begin_block_of(module: nn.Module) -> tuple[str | None, int | None] | None:
    """The ``(user_id, ipu_id)`` a ``BeginBlock`` put on ``module``, if any."""
    mark = getattr(module, _BEGIN_BLOCK_ATTR, None)
    return mark if isinstance(mark, tuple) else None


def has_block_annotations(model: nn.Module) -> bool:
    """Whether any submodule of ``model`` starts a block with ``BeginBlock``.

    ``Block`` contexts inside ``forward`` only show up when the model is traced, so a
    model annotated that way needs an explicit strategy (``Options.setExecutionStrategy``).
    """
    return any(begin_block_of(m) is not None for m in model.modules())


class Stage:
    """A group of blocks that runs on one device: ``Stage("B1", "B2").ipu(0)``."""

    def __init__(self, *block_names: str) -> None:
        if not block_names:
            raise PipelineError("Stage() needs at least one block name, e.g. Stage('B1')")
        for name in block_names:
            if not isinstance(name, str):
                raise PipelineError(
                    f"Stage block names are strings, got {name!r}; "
                    "name blocks with Block('B1') or BeginBlock(module, 'B1')"
                )
        self.blocks: tuple[str, ...] = tuple(block_names)
        self.ipu_id: int | None = None

    def ipu(self, ipu_id: int) -> Stage:
        """Place this stage on the replica's device ``ipu_id``; returns the stage."""
        _check_ipu_id(ipu_id, f"Stage{self.blocks!r}.ipu")
        self.ipu_id = ipu_id
        return self

    def __repr__(self) -> str:
        names = ", ".join(repr(b) for b in self.blocks)
        return f"Stage({names})" + (f".ipu({self.ipu_id})" if self.ipu_id is not None else "")


def _as_stages(stages: Sequence[Any], kind: str) -> tuple[Stage, ...]:
    out: list[Stage] = []
    for index, item in enumerate(stages):
        if isinstance(item, str):
            out.append(Stage(item).ipu(index))
        elif isinstance(item, Stage):
            out.append(item)
        elif isinstance(item, (list, tuple)) and item and all(isinstance(b, str) for b in item):
            out.append(Stage(*item).ipu(index))  # PopTorch: a list of block ids is one stage
        else:
            raise PipelineError(
                f"{kind} takes Stage objects or block names, got {item!r}; "
                f"use {kind}(Stage('B1').ipu(0), Stage('B2').ipu(1))"
            )
    return tuple(out)


class ExecutionStrategy:
    """Stages plus how they run; the executor reads ``stages``, ``kind`` and ``auto_stage``.

    With no stages, ``auto_stage`` says how blocks become stages (PopTorch's
    ``PipelinedExecution(poptorch.AutoStage.AutoIncrement)``; default ``SameAsIpu``).
    """

    kind: str = ""

    def __init__(self, *stages: Stage | str | Sequence[str] | AutoStage) -> None:
        self.auto_stage = AutoStage.SameAsIpu
        if len(stages) == 1 and isinstance(stages[0], AutoStage):
            self.auto_stage = stages[0]
            stages = ()
        elif any(isinstance(s, AutoStage) for s in stages):
            raise PipelineError(
                f"{type(self).__name__}: an AutoStage is given alone, not with stages; "
                f"use {type(self).__name__}(AutoStage.AutoIncrement)"
            )
        self.stages: tuple[Stage, ...] = _as_stages(stages, type(self).__name__)

    def default_ipu(self, index: int) -> int:
        """Device of stage ``index`` when neither it nor its blocks name one."""
        return index

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.stages))})"


class PipelinedExecution(ExecutionStrategy):
    """Run the micro-batches of one step through the stages concurrently.

    With no stages, each block becomes a stage (on its ``ipu_id``, else on the next
    device).  ``schedule`` is ``"1f1b"`` (default: one forward, one backward once the
    pipeline is full; holds at most one micro-batch per stage in flight) or ``"gpipe"``
    (all forwards, then all backwards).
    """

    kind = "pipelined"

    def __init__(
        self,
        *stages: Stage | str | Sequence[str] | AutoStage,
        schedule: Literal["1f1b", "gpipe"] = "1f1b",
    ) -> None:
        super().__init__(*stages)
        if schedule not in ("1f1b", "gpipe"):
            raise PipelineError(f"schedule={schedule!r} is not one of '1f1b', 'gpipe'")
        self.schedule: str = schedule


class ShardedExecution(ExecutionStrategy):
    """Run one stage at a time (a debugging and reference strategy, no overlap).

    With no stages, each block becomes a stage.
    """

    kind = "sharded"


class Phase:
    """Stages that PopTorch runs at the same time in phased execution.

    ``Phase(Stage("A").ipu(0), Stage("B").ipu(1))`` or ``Phase("A", "B")`` (one stage of
    two blocks).  Here phases run one after the other, and so do their stages.
    """

    def __init__(self, *arg: Stage | str) -> None:
        if arg and all(isinstance(a, Stage) for a in arg):
            self.stages: list[Stage] = list(arg)  # type: ignore[arg-type]
        elif arg and all(isinstance(a, str) for a in arg):
            self.stages = [Stage(*arg)]  # type: ignore[arg-type]
        else:
            raise PipelineError(
                f"Phase takes Stage objects or block names, got {arg!r}; "
                "use Phase(Stage('A').ipu(0), Stage('B').ipu(1)) or Phase('A', 'B')"
            )

    def stage(self, idx: int) -> Stage:
        """The ``idx``-th stage of this phase."""
        return self.stages[idx]

    def ipus(self, *ipus: int) -> Phase:
        """Place the phase's stages, one device each, in order."""
        if len(ipus) != len(self.stages):
            raise PipelineError(
                f"Phase.ipus got {len(ipus)} ids for {len(self.stages)} stages; give one per stage"
            )
        for stage, ipu in zip(self.stages, ipus, strict=True):
            stage.ipu(ipu)
        return self


class _PhasedExecution(ShardedExecution):
    """PopTorch's phased execution, run as the sharded schedule (same results, no overlap).

    Phases are flattened in order: phase 0's stages, then phase 1's...  On an IPU phased
    execution trades speed for memory; here every stage's weights stay where they are,
    so sharded execution computes exactly what the phases would.
    """

    def __init__(self, *phases: Phase | Stage | str | Sequence[Stage | str]) -> None:
        if not phases:
            raise PipelineError(
                f"{type(self).__name__}() needs its phases (PopTorch has no automatic "
                f"phases): {type(self).__name__}(Phase('A'), Phase('B'))"
            )
        self._phases: list[Phase] = []
        for item in phases:
            if isinstance(item, Phase):
                phase = item
            elif isinstance(item, (Stage, str)):
                phase = Phase(item)
            else:
                phase = Phase(*item)
            self._phases.append(phase)
        self._separate_backward_phase = False
        self._tensors_liveness = Liveness.AlwaysLive
        super().__init__(*[stage for phase in self._phases for stage in phase.stages])

    def default_ipu(self, index: int) -> int:
        """An unplaced stage runs on the device of its position within its phase."""
        for phase in self._phases:
            if index < len(phase.stages):
                return index
            index -= len(phase.stages)
        return 0

    def phase(self, phase: int) -> Phase:
        """The ``phase``-th phase."""
        return self._phases[phase]

    def useSeparateBackwardPhase(self, use: bool = True) -> _PhasedExecution:
        """Accepted: backward phases have no separate schedule here."""
        self._separate_backward_phase = bool(use)
        return self


class SerialPhasedExecution(_PhasedExecution):
    """PopTorch's serial phased execution; runs as ``ShardedExecution`` of its stages."""

    def setTensorsLiveness(self, liveness: Liveness) -> SerialPhasedExecution:
        """Accepted: tensors stay in host (or GPU) memory here."""
        self._tensors_liveness = Liveness(liveness)
        return self


class ParallelPhasedExecution(_PhasedExecution):
    """PopTorch's parallel phased execution; runs as ``ShardedExecution`` of its stages."""

    def sendTensorsOffChipAfterFwd(self, off_chip: bool = True) -> ParallelPhasedExecution:
        """Accepted: tensors stay in host (or GPU) memory here."""
        self._tensors_liveness = Liveness.OffChipAfterFwd if off_chip else Liveness.AlwaysLive
        return self


#: The name PopTorch's tutorials use for phased execution in general.
PhasedExecution = SerialPhasedExecution


def check_accumulation(strategy: ExecutionStrategy | None, gradient_accumulation: int) -> None:
    """Raise if pipelined training has fewer accumulation steps than stages.

    A pipeline of N stages only fills when at least N micro-batches flow through it
    per weight update (PopART's rule: the accumulation factor must be at least the
    number of stages).  Stages known only after tracing (auto-staging) are checked
    again by ``StageRunner``.
    """
    if isinstance(strategy, PipelinedExecution) and strategy.stages:
        check_depth(len(strategy.stages), gradient_accumulation)


def check_depth(num_stages: int, micro_batches: int) -> None:
    if micro_batches < num_stages:
        raise PipelineError(
            f"gradient accumulation {micro_batches} is too small for {num_stages} pipeline "
            f"stages: set opts.Training.gradientAccumulation(n) with n >= {num_stages}, "
            "or use ShardedExecution"
        )
