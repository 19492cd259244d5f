"""Block annotations, stages and execution strategies (the PopTorch names).

Re-exported by :mod:`popdist_torch.pipeline`; kept apart so the splitter and the
runner can import them without a cycle.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Literal

from torch import nn

from popdist_torch.errors import PipelineError

_BEGIN_BLOCK_ATTR = "_popdist_begin_block"


class _TraceState(threading.local):
    """Per-thread record of the block the forward being traced is in."""

    def __init__(self) -> None:
        self.tracing = False
        self.current: str | None = None
        self.inside_context: str | None = None
        self.blocks: dict[str, int | None] = {}
        self.unnamed = 0

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


_trace_state = _TraceState()


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


def _enter_block(name: str | None, ipu_id: int | None) -> str:
    """Make ``name`` the current block of the trace; returns the resolved name."""
    state = _trace_state
    if name is None:
        name = f"block{state.unnamed}"
        state.unnamed += 1
    known = state.blocks.get(name, ipu_id)
    if name in state.blocks and ipu_id is not None and known is not None and known != ipu_id:
        raise PipelineError(
            f"block {name!r} is placed on ipu_id {known} and on ipu_id {ipu_id}; "
            "give each block a single ipu_id"
        )
    state.blocks[name] = ipu_id if ipu_id is not None else state.blocks.get(name)
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

    def __enter__(self) -> Block:
        state = _trace_state
        if state.tracing:
            if state.inside_context is not None:
                raise PipelineError(
                    f"Block({self.user_id!r}) opened inside Block({state.inside_context!r}); "
                    "blocks do not nest: close the outer block first"
                )
            state.inside_context = _enter_block(_block_name(self.user_id, self.ipu_id), self.ipu_id)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if _trace_state.tracing:
            _trace_state.inside_context = None


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


def _as_stages(stages: Sequence[Stage | str], kind: str) -> tuple[Stage, ...]:
    out: list[Stage] = []
    for index, item in enumerate(stages):
        if isinstance(item, str):
            out.append(Stage(item).ipu(index))
        elif isinstance(item, Stage):
            out.append(item)
        else:
            raise PipelineError(
                f"{kind} takes Stage objects or block names, got {item!r}; "
                f"use {kind}(Stage('B1').ipu(0), Stage('B2').ipu(1))"
            )
    return tuple(out)


class _ExecutionStrategy:
    """Stages plus how they run; the executor reads ``stages`` and ``kind``."""

    kind: str = ""

    def __init__(self, *stages: Stage | str) -> None:
        self.stages: tuple[Stage, ...] = _as_stages(stages, type(self).__name__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.stages))})"


class PipelinedExecution(_ExecutionStrategy):
    """Run the micro-batches of one step through the stages concurrently.

    With no stages, each block becomes a stage (on its ``ipu_id``, else on the next
    device).  ``schedule`` is ``"1f1b"`` (default: one forward, one backward once the
    pipeline is full; holds at most one micro-batch per stage in flight) or ``"gpipe"``
    (all forwards, then all backwards).
    """

    kind = "pipelined"

    def __init__(self, *stages: Stage | str, schedule: Literal["1f1b", "gpipe"] = "1f1b") -> None:
        super().__init__(*stages)
        if schedule not in ("1f1b", "gpipe"):
            raise PipelineError(f"schedule={schedule!r} is not one of '1f1b', 'gpipe'")
        self.schedule: str = schedule


class ShardedExecution(_ExecutionStrategy):
    """Run one stage at a time (a debugging and reference strategy, no overlap).

    With no stages, each block becomes a stage.
    """

    kind = "sharded"


def check_accumulation(strategy: _ExecutionStrategy | None, gradient_accumulation: int) -> None:
    """Raise if pipelined training has fewer accumulation steps than stages.

    A pipeline of N stages only fills when at least N micro-batches flow through it
    per weight update (PopART's rule: the accumulation factor must be at least the
    number of stages).  Stages known only after tracing (auto-staging) are checked
    again by ``StageRunner``.
    """
    if isinstance(strategy, PipelinedExecution) and strategy.stages:
        _check_depth(len(strategy.stages), gradient_accumulation)


def _check_depth(num_stages: int, micro_batches: int) -> None:
    if micro_batches < num_stages:
        raise PipelineError(
            f"gradient accumulation {micro_batches} is too small for {num_stages} pipeline "
            f"stages: set opts.Training.gradientAccumulation(n) with n >= {num_stages}, "
            "or use ShardedExecution"
        )
