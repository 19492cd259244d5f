"""Split an annotated model into stages: trace with torch.fx, tag nodes by block, split.

The forward is traced once per call signature with a tracer that records, for every
graph node, the block that was current when the node was created (``Block`` contexts
and ``BeginBlock`` modules set it).  The graph is then cut with
``torch.fx.passes.split_module`` into one ``GraphModule`` per stage; the top-level
graph that calls them tells which values cross from stage to stage.  A forward torch.fx
cannot trace (control flow on tensor values, shapes used as numbers, attributes set in
forward) raises :class:`Untraceable`, and the runner stages it eagerly instead
(:mod:`popdist_torch.pipeline.eager`).

The micro-batch's inputs, positional and keyword, are bound to ``forward``'s parameters:
tensors become the graph's inputs, other values (``return_dict=False``) and the defaults
of the parameters not given are fixed for the trace.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.split_module import split_module

from popdist_torch.enums import AutoStage
from popdist_torch.errors import PipelineError
from popdist_torch.pipeline.blocks import (
    ExecutionStrategy,
    Stage,
    begin_block_of,
    enter_block,
    trace_state,
)

WHOLE_MODEL = "__model__"


@dataclass(frozen=True)
class Source:
    """Where a stage input or a model output comes from.

    ``kind`` is ``"input"`` (``index`` = position of the micro-batch tensor),
    ``"default"`` / ``"attr"`` (``value`` = a constant or a module attribute, e.g. a
    parameter) or ``"stage"`` (``stage`` produced it as its output number ``index``).
    """

    kind: str
    index: int = 0
    stage: int = -1
    value: Any = None


@dataclass
class StageSpec:
    """One stage: its blocks, its device index and its piece of the graph."""

    index: int
    ipu_id: int
    blocks: tuple[str, ...]
    module: nn.Module | None = None
    inputs: list[Source] = field(default_factory=list)
    num_outputs: int = 0
    # (consumer stage, output index) pairs: who reads each of this stage's outputs
    consumers: dict[int, list[int]] = field(default_factory=dict)


@dataclass
class StagePlan:
    """The stages of a model for one call signature and how values flow between them."""

    stages: list[StageSpec]
    output: Any  # the forward's return structure with Source leaves
    output_sources: list[Source]  # the leaves of ``output`` in order
    num_inputs: int
    block_order: list[str]
    loss: Source | None = None  # where the loss is, once a training step has decided

    def active(self) -> list[StageSpec]:
        """Stages that have work (a block can hold no operation)."""
        return [s for s in self.stages if s.module is not None]


class Untraceable(PipelineError):
    """torch.fx cannot trace this forward: the runner stages it at run time instead."""


@dataclass(frozen=True)
class Bound:
    """A micro-batch's inputs bound to ``forward``'s parameters, in signature order.

    ``names`` are the parameters given a tensor (the graph's inputs, in order);
    ``fixed`` the other given values and the defaults of the parameters not given.
    """

    names: tuple[str, ...]
    values: tuple[Any, ...]
    fixed: dict[str, Any]

    def key(self) -> tuple[Any, ...]:
        """What a plan depends on: which inputs are tensors, and the fixed values."""
        return (self.names, tuple((k, repr(v)) for k, v in self.fixed.items()))


def bind(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    """Bind ``model(*args, **kwargs)`` to its forward's named parameters.

    Raises :class:`Untraceable` when the call fills ``*args`` or ``**kwargs`` (the trace
    cannot name them) and :class:`PipelineError` when the call does not fit the signature.
    """
    signature = inspect.signature(model.forward)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise PipelineError(
            f"{type(model).__name__}.forward cannot take the micro-batch's inputs "
            f"({len(args)} positional, keywords {sorted(kwargs)}): {exc}"
        ) from None
    names: list[str] = []
    values: list[Any] = []
    fixed: dict[str, Any] = {}
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            if bound.arguments.get(p.name):
                raise Untraceable(f"{type(model).__name__}.forward takes *{p.name}")
            continue
        if p.name not in bound.arguments:
            fixed[p.name] = p.default
        elif isinstance(bound.arguments[p.name], torch.Tensor):
            names.append(p.name)
            values.append(bound.arguments[p.name])
        else:
            fixed[p.name] = bound.arguments[p.name]
    return Bound(tuple(names), tuple(values), fixed)


class _BlockTracer(fx.Tracer):
    """A tracer that tags each node with the block current when it was created."""

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        node.meta["popdist_block"] = trace_state.current
        return node

    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        mark = begin_block_of(m)
        if mark is not None:
            user_id, ipu_id = mark
            name = (
                user_id if user_id is not None else (f"ipu{ipu_id}" if ipu_id is not None else None)
            )
            enter_block(name, ipu_id)
        return super().call_module(m, forward, args, kwargs)


def trace(model: nn.Module, bound: Bound) -> tuple[fx.GraphModule, dict[str, int | None]]:
    """Trace ``model`` for the inputs ``bound``; nodes carry ``meta['popdist_block']``.

    Raises :class:`Untraceable` when torch.fx cannot (the user's modules are left as
    they were: an attribute the trace set to a proxy is restored).
    """
    state = trace_state
    state.reset()
    state.tracing = True
    saved = [(m, _state_of(m)) for m in model.modules()]
    # The trace runs forward with real buffers: what it does to them in place is undone.
    values = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        graph = _BlockTracer().trace(model, concrete_args=bound.fixed or None)
        blocks = dict(state.blocks)
    except PipelineError:
        raise
    except Exception as exc:  # torch.fx raises many kinds; all mean "cannot split"
        raise Untraceable(
            f"torch.fx could not trace {type(model).__name__}.forward ({type(exc).__name__}: {exc})"
        ) from exc
    finally:
        state.reset()
        left = _restore_proxies(saved)
        with torch.no_grad():
            for buffer, value in values:
                buffer.copy_(value)
    if left:
        raise Untraceable(
            f"{type(model).__name__}.forward sets attribute(s) {', '.join(left)}, which a "
            "traced graph would not repeat"
        )
    _check_no_state_mutation(model, graph)
    return fx.GraphModule(model, graph), blocks


def _check_no_state_mutation(model: nn.Module, graph: fx.Graph) -> None:
    """A forward that updates a buffer in place (``self.buf.mul_(m)``, often under
    ``torch.no_grad()``, which the trace cannot see) runs eagerly, as written."""
    for node in graph.nodes:
        target = str(node.target)
        if node.op == "call_method" and target.endswith("_") and not target.startswith("_"):
            first = node.args[0] if node.args else None
            if isinstance(first, fx.Node) and first.op == "get_attr":
                raise Untraceable(
                    f"{type(model).__name__}.forward updates {first.target} in place ({target})"
                )


_State = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


def _state_of(module: nn.Module) -> _State:
    """Copies of what a forward may set on a module: attributes, parameters, buffers."""
    return dict(vars(module)), dict(module._parameters), dict(module._buffers)


def _restore_proxies(saved: list[tuple[nn.Module, _State]]) -> list[str]:
    """Undo what the trace's run of forward set on the modules; returns what it set.

    An attribute, parameter or buffer that forward assigns (a proxy left behind, a counter
    bumped) is a side effect the traced graph would never repeat: such a forward runs
    eagerly instead.
    """
    changed: list[str] = []
    for module, (attributes, parameters, buffers) in saved:
        changed += _restore(vars(module), attributes)
        changed += _restore(module._parameters, parameters)
        changed += _restore(module._buffers, buffers)
    return changed


def _restore(current: dict[str, Any], old: dict[str, Any]) -> list[str]:
    """Set `current` back to `old`; returns the names whose values differed."""
    names = sorted(k for k in current.keys() | old.keys() if current.get(k) is not old.get(k))
    if names:
        current.clear()
        current.update(old)
    return names


def _compute_nodes(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.nodes if n.op not in ("placeholder", "output")]


def _assign_blocks(gm: fx.GraphModule) -> list[str]:
    """Give every compute node a block; returns the blocks in forward order."""
    order: list[str] = []
    for node in _compute_nodes(gm.graph):
        block = node.meta.get("popdist_block")
        if block is not None and block not in order:
            order.append(block)
    first = order[0] if order else WHOLE_MODEL
    for node in _compute_nodes(gm.graph):
        if node.meta.get("popdist_block") is None:
            node.meta["popdist_block"] = first
    # A module attribute (e.g. a bare parameter) belongs where it is first used.
    for node in _compute_nodes(gm.graph):
        if node.op == "get_attr" and node.users:
            node.meta["popdist_block"] = next(iter(node.users)).meta["popdist_block"]
    return order or [WHOLE_MODEL]


def resolve_stages(
    strategy: ExecutionStrategy | None,
    order: list[str],
    ipu_of: dict[str, int | None],
) -> list[StageSpec]:
    """Turn the strategy's stages (or one stage per block) into ``StageSpec``s."""
    if order == [WHOLE_MODEL]:
        if strategy is not None and strategy.stages:
            raise PipelineError(
                f"{strategy!r} names blocks but the model has none: annotate it with "
                "Block('B1') contexts or BeginBlock(module, 'B1')"
            )
        return [StageSpec(0, 0, (WHOLE_MODEL,))]
    stages = (
        list(strategy.stages)
        if strategy is not None and strategy.stages
        else _auto_stages(strategy, order, ipu_of)
    )
    known = set(order)
    placed: dict[str, int] = {}
    for index, stage in enumerate(stages):
        for name in stage.blocks:
            if name not in known:
                raise PipelineError(
                    f"unknown block {name!r} in {stage!r}; the model's blocks are "
                    f"{', '.join(repr(b) for b in order)}"
                )
            if name in placed:
                raise PipelineError(
                    f"block {name!r} is on stage {placed[name]} and on stage {index}; "
                    "put each block on one stage"
                )
            placed[name] = index
    missing = [b for b in order if b not in placed]
    if missing:
        raise PipelineError(
            f"block(s) {', '.join(repr(b) for b in missing)} are on no stage of "
            f"{strategy!r}; add them to a Stage(...)"
        )
    specs: list[StageSpec] = []
    for index, stage in enumerate(stages):
        ipu = stage.ipu_id
        if ipu is None:
            ids = {ipu_of.get(b) for b in stage.blocks}
            only = ids.pop() if len(ids) == 1 else None
            default = strategy.default_ipu(index) if strategy is not None else index
            ipu = only if only is not None else default
        specs.append(StageSpec(index, ipu, stage.blocks))
    return specs


def _auto_stages(
    strategy: ExecutionStrategy | None, order: list[str], ipu_of: dict[str, int | None]
) -> list[Stage]:
    """The stages of a strategy that names none: by ipu id, or one per block."""
    auto = strategy.auto_stage if strategy is not None else AutoStage.SameAsIpu
    block_ipus = [ipu_of.get(name) for name in order]
    if auto == AutoStage.SameAsIpu and all(i is not None for i in block_ipus):
        # PopTorch's default: the stage id is the ipu id, so the blocks of one device
        # form one stage, and stages run in device order.
        return [
            Stage(*[n for n, i in zip(order, block_ipus, strict=True) if i == ipu]).ipu(ipu)
            for ipu in sorted({i for i in block_ipus if i is not None})
        ]
    # AutoIncrement (or blocks without an ipu_id): one stage per block.
    stages = []
    for name in order:
        stage = Stage(name)
        ipu = ipu_of.get(name)
        stages.append(stage.ipu(ipu) if ipu is not None else stage)
    return stages


def check_devices(specs: list[StageSpec], num_devices: int) -> None:
    for spec in specs:
        if spec.ipu_id >= num_devices:
            raise PipelineError(
                f"stage {spec.index} ({', '.join(spec.blocks)}) is on ipu {spec.ipu_id} but "
                f"a replica has {num_devices} device(s) (ids 0..{num_devices - 1}); raise "
                "--ipus-per-replica or place the stage with .ipu(n) on an existing device"
            )


def _check_forward_flow(gm: fx.GraphModule, stage_of_block: dict[str, int]) -> None:
    """Every value must flow from a stage to itself or a later stage."""
    for node in _compute_nodes(gm.graph):
        here = stage_of_block[node.meta["popdist_block"]]
        for arg in node.all_input_nodes:
            if arg.op == "placeholder" or arg.op == "get_attr":
                continue
            there = stage_of_block[arg.meta["popdist_block"]]
            if there > here:
                raise PipelineError(
                    f"block {arg.meta['popdist_block']!r} (stage {there}) feeds block "
                    f"{node.meta['popdist_block']!r} (stage {here}): activations would go "
                    "backwards; list the stages in forward order (blocks that return to an "
                    "earlier ipu_id: PipelinedExecution(AutoStage.AutoIncrement))"
                )


ParameterUsers = dict[int, tuple[nn.Parameter, set[int]]]  # id -> (parameter, stages)


def check_shared_parameters(users: ParameterUsers, specs: list[StageSpec]) -> None:
    """A weight used by several stages must have them on one device (PopTorch's rule).

    Shared on one ``ipu_id`` (tied embedding and decoder weights), its gradient is summed
    from every use, as in plain torch; across devices PopTorch refuses the layout.
    """
    for param, stages in users.values():
        by_ipu: dict[int, int] = {}
        for index in sorted(stages):
            by_ipu.setdefault(specs[index].ipu_id, index)
        if len(by_ipu) > 1:
            (ipu_a, a), (ipu_b, b) = sorted(by_ipu.items(), key=lambda kv: kv[1])[:2]
            raise PipelineError(
                f"a parameter of shape {tuple(param.shape)} is used by stage {a} and stage {b} "
                f"on different devices (ipu {ipu_a} and ipu {ipu_b}); layers that share weights "
                "must sit on one device, as PopTorch requires: give their blocks the same "
                "ipu_id (e.g. the tied embedding and lm_head both ipu_id=0)"
            )


def _stage_parameters(specs: list[StageSpec]) -> ParameterUsers:
    users: ParameterUsers = {}
    for spec in specs:
        params = list(spec.module.parameters()) if spec.module is not None else []
        params += [
            s.value for s in spec.inputs if s.kind == "attr" and isinstance(s.value, nn.Parameter)
        ]
        for p in params:
            users.setdefault(id(p), (p, set()))[1].add(spec.index)
    return users


def build_plan(
    model: nn.Module,
    strategy: ExecutionStrategy | None,
    bound: Bound,
    num_devices: int,
) -> StagePlan:
    """Trace, validate and split ``model`` into the stages of ``strategy``.

    Raises :class:`Untraceable` when torch.fx cannot trace the forward.
    """
    gm, ipu_of = trace(model, bound)
    order = _assign_blocks(gm)
    specs = resolve_stages(strategy, order, ipu_of)
    check_devices(specs, num_devices)
    stage_of_block = {b: s.index for s in specs for b in s.blocks}
    _check_forward_flow(gm, stage_of_block)
    split = split_module(
        gm, model, lambda n: stage_of_block[n.meta["popdist_block"]], tuple_return=True
    )
    values: dict[fx.Node, Source] = {}
    output: Any = None
    for node in split.graph.nodes:
        if node.op == "placeholder":
            name = str(node.target)
            values[node] = (
                Source("input", index=bound.names.index(name))
                if name in bound.names
                else Source("default", value=bound.fixed.get(name))
            )
        elif node.op == "get_attr":
            values[node] = Source("attr", value=_get_attr(split, str(node.target)))
        elif node.op == "call_module":
            spec = specs[int(str(node.target).rsplit("_", 1)[1])]
            spec.module = getattr(split, str(node.target))
            spec.inputs = [_source_of(a, values) for a in node.args]
            if node.kwargs:
                raise PipelineError("internal: a stage was called with keyword arguments")
        elif node.op == "call_function" and node.target is operator.getitem:
            producer, position = node.args
            assert isinstance(producer, fx.Node) and isinstance(position, int)
            stage = int(str(producer.target).rsplit("_", 1)[1])
            specs[stage].num_outputs = max(specs[stage].num_outputs, position + 1)
            values[node] = Source("stage", index=position, stage=stage)
        elif node.op == "output":
            output = _map_output(node.args[0], values)
        else:
            raise PipelineError(f"internal: unexpected node {node.op} {node.target} in split graph")
    for spec in specs:
        for src in spec.inputs:
            if src.kind == "stage":
                specs[src.stage].consumers.setdefault(src.index, []).append(spec.index)
    check_shared_parameters(_stage_parameters(specs), specs)
    leaves: list[Source] = []
    _collect(output, leaves)
    return StagePlan(specs, output, leaves, len(bound.names), order)


def _collect(structure: Any, leaves: list[Source]) -> None:
    if isinstance(structure, Source):
        leaves.append(structure)
    elif isinstance(structure, (tuple, list)):
        for item in structure:
            _collect(item, leaves)
    elif isinstance(structure, dict):
        for item in structure.values():
            _collect(item, leaves)


def _get_attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _map_output(arg: Any, values: dict[fx.Node, Source]) -> Any:
    """The forward's return structure with each graph value replaced by its ``Source``."""
    if isinstance(arg, fx.Node):
        return values[arg]
    if isinstance(arg, tuple):
        return tuple(_map_output(a, values) for a in arg)
    if isinstance(arg, list):
        return [_map_output(a, values) for a in arg]
    if isinstance(arg, dict):
        return {k: _map_output(v, values) for k, v in arg.items()}
    return Source("default", value=arg)


def _source_of(arg: Any, values: dict[fx.Node, Source]) -> Source:
    if isinstance(arg, fx.Node):
        return values[arg]
    return Source("default", value=arg)


def loss_candidates(plan: StagePlan) -> list[Source]:
    """Where the loss may be: every value a stage computes that the forward returns, in the
    output's order (the loss rule, :mod:`popdist_torch.surface.loss`, picks one on the
    values of the first micro-batch: the one ``identity_loss`` marked, else a dict's
    ``"loss"``, else a tuple's last or first element)."""
    found: list[Source] = []
    for source in plan.output_sources:
        if source.kind == "stage" and not any(source is other for other in found):
            found.append(source)
    if not found:
        raise PipelineError(
            "training needs the model's forward to return the loss (a tensor computed by the "
            "model): alone, marked by identity_loss anywhere in its output, as the first or "
            "last element of a tuple, or under the key 'loss'"
        )
    return found
