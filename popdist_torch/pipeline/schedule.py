"""Run the stages of a model over micro-batches: schedules, worker threads, devices.

One worker thread per stage executes that stage's list of operations (forward or
backward of micro-batch m).  The autograd graph is cut at stage boundaries: a stage
receives its inputs detached (``requires_grad_``), runs ``torch.autograd.backward`` on
its own outputs with the gradients its consumers sent back, and sends the gradients of
its inputs to their producers.  Each stage owns disjoint parameters, so gradients
accumulate into ``.grad`` without races, and since every stage runs backward in
micro-batch order the sums are those of a plain sequential loop.

Pipelined: stages wait only for their data (GPipe or 1F1B order).  Sharded: the same
workers also wait for a global turn, so exactly one stage runs at a time.

That is the traced path (``stages``).  A model torch.fx cannot trace is staged at its block
boundaries while it runs (``eager``); ``StageRunner`` picks the path once per call
signature, and the executor above it never knows which.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from popdist_torch.errors import PipelineError
from popdist_torch.pipeline.blocks import (
    ExecutionStrategy,
    PipelinedExecution,
    check_depth,
)
from popdist_torch.pipeline.eager import Call, EagerPlan, EagerStages
from popdist_torch.pipeline.stages import (
    Bound,
    Source,
    StagePlan,
    StageSpec,
    Untraceable,
    bind,
    build_plan,
    loss_candidates,
)
from popdist_torch.surface.loss import (
    leaf_at,
    loss_like,
    marked_path,
    unmarked_path,
    watching_losses,
)

Op = tuple[str, int]  # ("F" | "B", micro-batch index)

log = logging.getLogger("popdist_torch.pipeline")


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch's call of the model: ``model(*args, **kwargs)``.

    ``StageRunner`` also takes a plain sequence of tensors as the positional arguments.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _call(micro_batch: MicroBatch | Sequence[Any]) -> Call:
    if isinstance(micro_batch, MicroBatch):
        return tuple(micro_batch.args), dict(micro_batch.kwargs)
    return tuple(micro_batch), {}


@dataclass(frozen=True)
class StageEvent:
    """One operation a stage ran: for the profile (Chrome trace, timeline)."""

    stage: int
    device: int
    kind: str  # "F" forward, "B" backward
    micro_batch: int
    start: float  # seconds, time.perf_counter()
    end: float


def pipeline_ops(
    position: int, num_stages: int, micro_batches: int, schedule: str, training: bool
) -> list[Op]:
    """The operations of the stage at ``position`` (0 = first) in a pipelined step."""
    forwards = [("F", m) for m in range(micro_batches)]
    if not training:
        return forwards
    backwards = [("B", m) for m in range(micro_batches)]
    if schedule == "gpipe":
        return forwards + backwards
    warmup = min(num_stages - 1 - position, micro_batches)
    ops: list[Op] = forwards[:warmup]
    for i in range(micro_batches - warmup):
        ops += [forwards[warmup + i], backwards[i]]
    return ops + backwards[micro_batches - warmup :]


def sharded_order(num_stages: int, micro_batches: int, training: bool) -> list[tuple[int, Op]]:
    """The single global order of a sharded step: (stage position, op)."""
    order: list[tuple[int, Op]] = []
    for m in range(micro_batches):
        order += [(s, ("F", m)) for s in range(num_stages)]
        if training:
            order += [(s, ("B", m)) for s in reversed(range(num_stages))]
    return order


_recorders: list[list[StageEvent]] = []


@contextlib.contextmanager
def record_schedule() -> Iterator[list[StageEvent]]:
    """Collect the operations every ``StageRunner`` runs inside the block (profiling).

    ``with record_schedule() as events: model(x, y)`` -- the executor owns its runner,
    so this is how a script sees the per-stage schedule of a training model.
    """
    events: list[StageEvent] = []
    _recorders.append(events)
    try:
        yield events
    finally:
        _recorders.remove(events)


def chrome_trace(events: Sequence[StageEvent]) -> dict[str, Any]:
    """The events as a Chrome trace (``chrome://tracing``, Perfetto): one row per stage."""
    origin = min((e.start for e in events), default=0.0)
    trace: list[dict[str, Any]] = [
        {
            "name": f"{e.kind}{e.micro_batch}",
            "cat": "forward" if e.kind == "F" else "backward",
            "ph": "X",
            "ts": (e.start - origin) * 1e6,
            "dur": (e.end - e.start) * 1e6,
            "pid": e.device,
            "tid": e.stage,
            "args": {"stage": e.stage, "device": e.device, "micro_batch": e.micro_batch},
        }
        for e in events
    ]
    for device in sorted({e.device for e in events}):
        trace.append(
            {"name": "process_name", "ph": "M", "pid": device, "args": {"name": f"device {device}"}}
        )
    for stage in sorted({(e.device, e.stage) for e in events}):
        trace.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": stage[0],
                "tid": stage[1],
                "args": {"name": f"stage {stage[1]}"},
            }
        )
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


class _Aborted(Exception):
    """Another worker failed; this one stops waiting."""


class _Exchange:
    """Values passed between workers, keyed; ``get`` blocks until the value is put."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._values: dict[tuple[Any, ...], Any] = {}
        self._turn = 0
        self.failed = False

    def put(self, key: tuple[Any, ...], value: Any) -> None:
        with self._cond:
            self._values[key] = value
            self._cond.notify_all()

    def get(self, key: tuple[Any, ...], keep: bool = False) -> Any:
        with self._cond:
            self._cond.wait_for(lambda: key in self._values or self.failed)
            if self.failed:
                raise _Aborted
            return self._values[key] if keep else self._values.pop(key)

    def wait_turn(self, turn: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._turn == turn or self.failed)
            if self.failed:
                raise _Aborted

    def next_turn(self) -> None:
        with self._cond:
            self._turn += 1
            self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self.failed = True
            self._cond.notify_all()


def stage_devices(num_devices: int, gpus: int, first: int = 0) -> list[torch.device]:
    """Where a replica's devices ``0 … num_devices − 1`` are (pure): its GPUs from ``first``
    on, one each, shared round-robin when there are fewer ``gpus`` than devices (with one
    GPU every stage is on ``cuda:0``); CPU workers without a GPU."""
    if gpus < 1:
        return [torch.device("cpu")] * num_devices
    return [torch.device("cuda", (first + i) % gpus) for i in range(num_devices)]


def default_devices(num_devices: int, gpus: int | None = None) -> list[torch.device]:
    """A replica's devices on ``gpus`` GPUs (the executor's plan says how many it may use;
    ``None``: every GPU this process sees)."""
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return stage_devices(num_devices, gpus)


class StageRunner:
    """Runs a model's stages over the micro-batches of one step.

    ``strategy`` is a ``PipelinedExecution`` or ``ShardedExecution`` (``None``: one
    stage per block, pipelined).  ``num_devices`` is the replica's device count
    (``--ipus-per-replica``; ``None``: as many as the stages' ipu ids need);
    ``devices`` overrides where device ``i`` is; ``gpus``: how many GPUs the devices may
    use (:func:`stage_devices`; ``None``: every GPU the process sees).  On CPU each device is a worker
    thread limited to ``threads_per_device`` intra-op threads (default: torch's thread
    count divided by the number of devices).  ``staging="eager"`` stages at the block
    boundaries as the model runs even where torch.fx could trace it (tests, benchmarks).
    """

    def __init__(
        self,
        model: nn.Module,
        strategy: ExecutionStrategy | None,
        *,
        num_devices: int | None,
        devices: Sequence[torch.device] | None = None,
        threads_per_device: int | None = None,
        profile: bool = False,
        staging: Literal["auto", "eager"] = "auto",
        gpus: int | None = None,
    ) -> None:
        if staging not in ("auto", "eager"):
            raise PipelineError(f"staging={staging!r} is not one of 'auto', 'eager'")
        if num_devices is not None and num_devices < 1:
            raise PipelineError(
                f"num_devices={num_devices} must be at least 1 (--ipus-per-replica)"
            )
        self.model = model
        self.strategy = strategy
        self.num_devices = num_devices
        self._given_devices = list(devices) if devices is not None else None
        self._gpus = gpus
        self._threads = threads_per_device
        self.devices: list[torch.device] = []
        self.threads_per_device = 1
        self.profile = profile
        self.staging = staging
        self.events: list[StageEvent] = []
        self._plans: dict[tuple[Any, ...], StagePlan | EagerStages] = {}
        self._recent: dict[tuple[int, bool], StagePlan | EagerPlan] = {}
        self._device_locks: list[threading.Lock] = []
        self._streams: dict[int, Any] = {}
        if num_devices is not None:
            self._set_devices(num_devices)

    def _set_devices(self, count: int) -> None:
        """Fix the replica's devices (once): where each is, its lock, its threads."""
        if self.devices:
            if count > len(self.devices):
                raise PipelineError(
                    f"a stage needs device {count - 1} but this runner has {len(self.devices)}"
                )
            return
        devices = self._given_devices
        if devices is None:
            devices = default_devices(count, self._gpus)
        if len(devices) < count:
            raise PipelineError(f"{len(devices)} devices given for {count} devices per replica")
        self.devices = devices[:count]
        self._device_locks = [threading.Lock() for _ in range(count)]
        self.threads_per_device = self._threads or max(1, torch.get_num_threads() // count)

    # -- public interface -------------------------------------------------------------
    def plan(self, num_inputs: int) -> StagePlan | EagerPlan:
        """The stage plan of the last call with micro-batches of ``num_inputs`` tensors."""
        key = (num_inputs, self.model.training)
        if key not in self._recent:
            raise PipelineError(
                f"no call with micro-batches of {num_inputs} tensors has run yet: the stages "
                "are known after the first forward"
            )
        return self._recent[key]

    @property
    def num_stages(self) -> int:
        """Stages of the most recently used plan (after the first call)."""
        if not self._recent:
            raise PipelineError("num_stages is known after the first forward")
        return len(next(reversed(self._recent.values())).stages)

    def staged_at_run_time(self) -> bool:
        """Whether the last call signature runs on the eager path (torch.fx could not trace)."""
        return isinstance(next(reversed(self._plans.values()), None), EagerStages)

    def forward_backward(
        self, micro_batches: Sequence[MicroBatch | Sequence[Any]], grad_scale: float = 1.0
    ) -> list[Any]:
        """Forward and backward of every micro-batch; gradients accumulate in ``.grad``.

        The result equals ``for mb in micro_batches: (grad_scale * loss(mb)).backward()``
        where the loss is the forward's return value, its ``"loss"``, or the last (else
        first) element of its tuple.  Returns each micro-batch's forward output, detached.
        """
        return self._step(micro_batches, training=True, grad_scale=grad_scale)

    def forward(self, micro_batches: Sequence[MicroBatch | Sequence[Any]]) -> list[Any]:
        """Forward only (inference), under ``torch.no_grad``; outputs per micro-batch."""
        return self._step(micro_batches, training=False, grad_scale=1.0)

    # -- execution --------------------------------------------------------------------
    def _step(
        self,
        micro_batches: Sequence[MicroBatch | Sequence[Any]],
        *,
        training: bool,
        grad_scale: float,
    ) -> list[Any]:
        if not micro_batches:
            raise PipelineError("no micro-batches to run")
        calls = [_call(mb) for mb in micro_batches]
        entry, bounds = self._entry(calls)
        pipelined = isinstance(self.strategy, PipelinedExecution) or self.strategy is None

        def check(num_stages: int) -> None:
            if training and pipelined:
                check_depth(num_stages, len(calls))

        if isinstance(entry, EagerStages):
            device = self.devices[0] if self.devices else torch.device("cpu")
            recording = self.profile or bool(_recorders)
            # Each stage computes with its device's share of threads, as a traced stage does.
            caller_threads = torch.get_num_threads()
            if self.devices:
                torch.set_num_threads(self.threads_per_device)
            try:
                return entry.run(
                    calls,
                    training=training,
                    grad_scale=grad_scale,
                    record=self.record if recording else None,
                    device=device,
                    check=check,
                )
            finally:
                torch.set_num_threads(caller_threads)
        check(len(entry.stages))
        return self._run(
            entry, [b.values for b in bounds], training=training, grad_scale=grad_scale
        )

    def _entry(self, calls: list[Call]) -> tuple[StagePlan | EagerStages, list[Bound]]:
        """The plan of these calls' signature (made once), and each call's bound inputs."""
        num_inputs = sum(isinstance(v, torch.Tensor) for v in (*calls[0][0], *calls[0][1].values()))
        try:
            bounds = [bind(self.model, args, kwargs) for args, kwargs in calls]
            keys = {b.key() for b in bounds}
            if len(keys) != 1:
                raise PipelineError(
                    "micro-batches have different inputs: "
                    + "; ".join(sorted(", ".join(k[0]) for k in keys))
                )
            key: tuple[Any, ...] = (keys.pop(), self.model.training)
        except Untraceable:
            bounds = []
            key = (("*", len(calls[0][0]), tuple(sorted(calls[0][1]))), self.model.training)
        if key not in self._plans:
            self._plans[key] = self._new_entry(bounds[0] if bounds else None, num_inputs)
        return self._plans[key], bounds

    def _new_entry(self, bound: Bound | None, num_inputs: int) -> StagePlan | EagerStages:
        """Split the model with torch.fx, or, where it cannot trace, stage it as it runs."""
        limit = self.num_devices if self.num_devices is not None else sys.maxsize
        training = self.model.training

        def adopt(plan: StagePlan | EagerPlan) -> None:
            self._set_devices(max(s.ipu_id for s in plan.stages) + 1)
            self._recent[(num_inputs, training)] = plan

        if bound is not None and self.staging == "auto":
            try:
                plan = build_plan(self.model, self.strategy, bound, limit)
            except Untraceable as exc:
                log.info("%s: staged at its block boundaries as it runs", exc)
            else:
                adopt(plan)
                for spec in plan.active():
                    device = self.devices[spec.ipu_id]
                    if device.type != "cpu":
                        assert spec.module is not None
                        spec.module.to(device)
                return plan
        if self.devices and self.devices[0].type != "cpu":
            self.model.to(self.devices[0])  # the eager path computes on the first device
        return EagerStages(self.model, self.strategy, limit, adopt)

    def _run(
        self,
        plan: StagePlan,
        micro_batches: Sequence[Sequence[Any]],
        *,
        training: bool,
        grad_scale: float,
    ) -> list[Any]:
        step = _Step(self, plan, micro_batches, training=training, grad_scale=grad_scale)
        workers = [
            threading.Thread(
                target=step.work, args=(spec,), name=f"popdist-stage-{spec.index}", daemon=True
            )
            for spec in step.active
        ]
        # torch.set_num_threads in a worker also changes process-wide state (MKL, the
        # default for new threads), so the caller's setting is restored afterwards.
        caller_threads = torch.get_num_threads()
        try:
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        finally:
            torch.set_num_threads(caller_threads)
        if step.errors:
            raise step.errors[0]
        return [step.assemble(plan.output, m) for m in range(len(micro_batches))]

    def on_device(self, spec: StageSpec) -> _DeviceScope:
        """Hold ``spec``'s device (and its CUDA stream) while the stage computes."""
        lock = self._device_locks[spec.ipu_id]
        device = self.devices[spec.ipu_id]
        return _DeviceScope(lock, device, self._stream(spec.ipu_id, device))

    def _stream(self, ipu_id: int, device: torch.device) -> Any:
        if device.type != "cuda":
            return None
        if ipu_id not in self._streams:
            self._streams[ipu_id] = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        return self._streams[ipu_id]

    def record(
        self, spec: StageSpec, kind: str, m: int, start: float, end: float | None = None
    ) -> None:
        """Note that ``spec`` ran ``kind`` of micro-batch ``m`` from ``start`` (to now)."""
        if self.profile or _recorders:
            end = time.perf_counter() if end is None else end
            event = StageEvent(spec.index, spec.ipu_id, kind, m, start, end)
            if self.profile:
                self.events.append(event)
            for recorder in list(_recorders):
                recorder.append(event)


class _Step:
    """One step of a :class:`StageRunner`: what its stage workers share, and their work."""

    def __init__(
        self,
        runner: StageRunner,
        plan: StagePlan,
        micro_batches: Sequence[Sequence[Any]],
        *,
        training: bool,
        grad_scale: float,
    ) -> None:
        self.runner = runner
        self.plan = plan
        self.active = plan.active()
        self.micro_batches = micro_batches
        self.training = training
        self.grad_scale = grad_scale
        self.position = {spec.index: i for i, spec in enumerate(self.active)}
        self.candidates = loss_candidates(plan) if training else []
        self.loss = plan.loss  # the loss rule decides at the first step, one candidate too
        self.exchange = _Exchange()
        self.outputs: dict[tuple[int, int], list[Any]] = {}  # (stage, micro-batch) -> outputs
        self.wanted = {
            (s.stage, s.index)
            for s in plan.output_sources
            if isinstance(s, Source) and s.kind == "stage"
        }
        strategy = runner.strategy
        self.sharded = strategy is not None and not isinstance(strategy, PipelinedExecution)
        self.schedule = getattr(strategy, "schedule", "1f1b")
        self.turns: dict[tuple[int, Op], int] = {}
        if self.sharded:
            order = sharded_order(len(self.active), len(micro_batches), training)
            self.turns = {(pos, op): turn for turn, (pos, op) in enumerate(order)}
        self.errors: list[BaseException] = []
        self.grad_enabled = training or torch.is_grad_enabled()

    def _ops(self, pos: int) -> list[Op]:
        if self.sharded:
            ordered = sorted(self.turns.items(), key=lambda kv: kv[1])
            return [op for (p, op), _ in ordered if p == pos]
        count = len(self.micro_batches)
        return pipeline_ops(pos, len(self.active), count, self.schedule, self.training)

    def work(self, spec: StageSpec) -> None:
        """The worker thread of stage ``spec``: its operations in order, errors handed back."""
        pos = self.position[spec.index]
        saved: dict[int, tuple[list[Any], list[Any]]] = {}
        try:
            torch.set_num_threads(self.runner.threads_per_device)
            device = self.runner.devices[spec.ipu_id]
            if device.type == "cuda":
                torch.cuda.set_device(device)
            for op in self._ops(pos):
                if self.sharded:
                    self.exchange.wait_turn(self.turns[(pos, op)])
                kind, m = op
                if kind == "F":
                    self._forward(spec, m, device, saved)
                else:
                    self._backward(spec, m, *saved.pop(m))
                if self.sharded:
                    self.exchange.next_turn()
        except _Aborted:
            return
        except BaseException as exc:  # handed to the caller's thread
            self.errors.append(exc)
            self.exchange.fail()

    def _forward(
        self,
        spec: StageSpec,
        m: int,
        device: torch.device,
        saved: dict[int, tuple[list[Any], list[Any]]],
    ) -> None:
        inputs = [self._input(src, spec, m, device) for src in spec.inputs]
        deciding = self.loss is None and m == 0  # which output is the loss: told by its values
        watch: contextlib.AbstractContextManager[list[Any]] = (
            watching_losses() if deciding else contextlib.nullcontext([])
        )
        with (
            self.runner.on_device(spec),
            torch.set_grad_enabled(self.grad_enabled if self.training else False),
            watch as marks,
        ):
            start = time.perf_counter()
            assert spec.module is not None
            result = list(spec.module(*inputs))
            self.runner.record(spec, "F", m, start)
        if deciding:
            told: list[Any] = []  # a marked tensor returned twice is one loss, as unstaged
            for cand in self.candidates:
                if cand.stage == spec.index:
                    value = result[cand.index]
                    marked = any(value is mark for mark in marks)
                    marked = marked and not any(value is other for other in told)
                    told += [value] if marked else []
                    self.exchange.put(("loss?", cand), (marked, loss_like(value)))
        for i, value in enumerate(result):
            for consumer in spec.consumers.get(i, []):
                self.exchange.put(("act", consumer, spec.index, i, m), value)
            if (spec.index, i) in self.wanted:
                self.outputs[(spec.index, m)] = [_detach(v) for v in result]
        if self.training:
            saved[m] = (inputs, result)

    def _loss(self) -> Source:
        """The loss: the loss rule on micro-batch 0's values (the output ``identity_loss``
        marked, else the output itself, a dict's ``"loss"``, a tuple's last or first
        loss-like element), kept in the plan; a single candidate is checked as any other."""
        if self.loss is None:
            flags = {id(c): self.exchange.get(("loss?", c), keep=True) for c in self.candidates}

            def flag(leaf: Any, which: int) -> bool:
                return bool(flags[id(leaf)][which]) if id(leaf) in flags else False

            out = self.plan.output
            path = marked_path(out, lambda leaf: flag(leaf, 0), PipelineError)
            marked = path is not None
            if path is None:
                path = unmarked_path(out, lambda leaf: flag(leaf, 1), PipelineError)
            chosen = leaf_at(out, path)
            if not isinstance(chosen, Source) or id(chosen) not in flags:
                raise PipelineError(
                    "training needs the model's forward to return its loss, a tensor the model "
                    "computes, at the place the loss rule looks (docs/executor.md)"
                )
            if not marked and not flag(chosen, 1):
                raise PipelineError(
                    "training needs the model's forward to return its loss: a tensor that "
                    "depends on the parameters, marked by identity_loss anywhere in its output "
                    "(any shape), or with one element per micro-batch alone, first or last in "
                    "a tuple, or under the key 'loss'"
                )
            self.loss = self.plan.loss = chosen
        return self.loss

    def _backward(self, spec: StageSpec, m: int, inputs: list[Any], result: list[Any]) -> None:
        tensors: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        loss = self._loss()
        for i, value in enumerate(result):
            grad = None
            for consumer in spec.consumers.get(i, []):
                grad = _add(grad, self.exchange.get(("grad", spec.index, i, consumer, m)))
            if (loss.stage, loss.index) == (spec.index, i):
                grad = _add(grad, torch.full_like(value, self.grad_scale))
            if grad is not None and isinstance(value, torch.Tensor) and value.requires_grad:
                tensors.append(value)
                grads.append(grad.to(value.device))
        with self.runner.on_device(spec):
            start = time.perf_counter()
            if tensors:
                torch.autograd.backward(tensors, grads)
            self.runner.record(spec, "B", m, start)
        for src, value in zip(spec.inputs, inputs, strict=True):
            if src.kind == "stage":
                g = value.grad if isinstance(value, torch.Tensor) and value.requires_grad else None
                self.exchange.put(("grad", src.stage, src.index, spec.index, m), g)

    def _input(self, src: Source, spec: StageSpec, m: int, device: torch.device) -> Any:
        if src.kind == "input":
            return _to(self.micro_batches[m][src.index], device)
        if src.kind == "stage":
            value = self.exchange.get(("act", spec.index, src.stage, src.index, m))
            if isinstance(value, torch.Tensor):
                value = _to(value, device)
                if self.training and value.requires_grad:
                    value = value.detach().requires_grad_()
            return value
        return src.value

    def assemble(self, structure: Any, m: int) -> Any:
        """Micro-batch ``m``'s output in the model's own structure."""
        if isinstance(structure, Source):
            if structure.kind == "stage":
                return self.outputs[(structure.stage, m)][structure.index]
            if structure.kind == "input":
                return self.micro_batches[m][structure.index]
            return structure.value
        if isinstance(structure, tuple):
            return tuple(self.assemble(s, m) for s in structure)
        if isinstance(structure, list):
            return [self.assemble(s, m) for s in structure]
        if isinstance(structure, dict):
            return {k: self.assemble(v, m) for k, v in structure.items()}
        return structure


class _DeviceScope:
    """Hold a device (one stage computes on it at a time) and its CUDA stream."""

    def __init__(self, lock: threading.Lock, device: torch.device, stream: Any) -> None:
        self._lock = lock
        self._stream_ctx = torch.cuda.stream(stream) if stream is not None else None
        self._stream = stream

    def __enter__(self) -> None:
        self._lock.acquire()
        if self._stream_ctx is not None:
            self._stream_ctx.__enter__()  # type: ignore[no-untyped-call]

    def __exit__(self, *exc: object) -> None:
        try:
            if self._stream_ctx is not None:
                self._stream.synchronize()
                self._stream_ctx.__exit__(None, None, None)
        finally:
            self._lock.release()


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor) and value.device != device:
        return value.to(device)
    return value


def _detach(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _add(total: torch.Tensor | None, grad: torch.Tensor | None) -> torch.Tensor | None:
    if grad is None:
        return total
    if total is None:
        return grad
    return total + grad.to(total.device)
