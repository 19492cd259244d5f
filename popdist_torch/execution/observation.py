"""What a wrapped model shows besides its outputs: anchored tensors, synthetic-data throughput,
latency.

:class:`Observation` is the part of :class:`~popdist_torch.execution.executor.PoplarExecutor`
that PopTorch scripts use to look at a run: ``getTensorNames()`` and
``getAnchoredTensor(name)`` for the tensors ``Options.anchorTensor`` asked for
(:mod:`popdist_torch.execution.anchors`), and, with ``Options.enableSyntheticData(True)``,
generated inputs and the throughput of the calls
(:mod:`popdist_torch.execution.synthetic`). A model that uses neither pays one attribute
test per call.

``getLatency()`` is PopTorch's ``(min, max, mean)``, in fractional seconds, of the time
between a device iteration's first input being requested and its last output being
written back to the host, over the iterations of the model's latest call (inference
benchmarks call it after every batch). Here every device iteration runs on the host (or the
instance's GPU), so its round trip is the host-side time from the moment it starts reading
its micro-batches to the moment its outputs are kept (and, training, the optimizer has
stepped): the executor walks the iterations through :meth:`Observation._timed`, which
measures exactly that with ``time.perf_counter``.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from popdist_torch.errors import ExecutorError, ExecutorStateError
from popdist_torch.execution.anchors import Anchors, tensor_names
from popdist_torch.execution.batch import Batch
from popdist_torch.execution.outputs import OutputCollector
from popdist_torch.execution.runners import LocalReplicaRunner
from popdist_torch.execution.synthetic import SyntheticInputs, Throughput, now
from popdist_torch.options import Options

__all__ = ["Observation"]


class _StepCollector(OutputCollector):
    """The model's output collector, telling the anchors which micro-batch runs next."""

    def __init__(self, anchors: Anchors, *args: Any) -> None:
        super().__init__(*args)
        self._anchors = anchors

    def wants(self, iteration: int, step: int) -> bool:
        self._anchors.at_step(iteration, step)
        return super().wants(iteration, step)


class Observation:
    """Anchored tensors and synthetic data of one wrapped model."""

    _user_model: nn.Module
    _options: Options
    _training: bool
    _anchors: Anchors | None
    _synthetic: SyntheticInputs | None
    _throughput: Throughput | None
    _observing: bool
    _runner: Any  # the executor's ReplicaRunner
    _latencies: tuple[float, ...] = ()

    def _check_alive(self) -> None:
        raise NotImplementedError

    def _observe(self, device: torch.device) -> None:
        """Set up what the options ask to observe (called once the model is placed)."""
        opts = self._options
        wanted = getattr(opts, "anchored_tensors", ())
        self._anchors = Anchors(self._user_model, opts, training=self._training) if wanted else None
        if self._anchors is not None and self._anchors.watches_outputs:
            self._replicas_in_turn()
        self._synthetic, self._throughput = None, None
        if getattr(opts, "synthetic_data", False):
            self._synthetic = SyntheticInputs(device)
            kind = "trainingModel" if self._training else "inferenceModel"
            process = opts.Distributed.processId
            self._throughput = Throughput(f"synthetic data, {kind} on instance {process}")
            weakref.finalize(self, self._throughput.report)
        self._observing = self._anchors is not None or self._throughput is not None

    # -- PopTorch's methods -------------------------------------------------------------
    def getTensorNames(self) -> list[str]:
        """The names ``Options.anchorTensor`` takes for this model (see ``anchors.py``)."""
        self._check_alive()
        return tensor_names(self._user_model, training=self._training)

    def getAnchoredTensor(self, short_name: str) -> Any:
        """The tensor anchored as ``short_name``, as the last call left it."""
        self._check_alive()
        if self._anchors is None:
            raise _no_anchor(short_name)
        return self._anchors.value(short_name)

    def throughput(self) -> dict[str, float]:
        """Samples per second of the calls so far (``enableSyntheticData(True)`` runs).

        ``calls``, ``samples``, ``seconds`` and ``samples_per_second``, from the second call on
        (the first includes one-time set-up), or of the first call if it is the only one.
        """
        if self._throughput is None:
            raise _not_synthetic()
        return self._throughput.figures()

    # -- the executor's side ------------------------------------------------------------
    def _timed(self, iterations: int) -> Iterator[int]:
        """``range(iterations)``, timing each iteration from its start to the next request.

        A call's figures replace the last call's once it has run all its iterations; a call
        that raised leaves the last complete call's figures.
        """
        durations: list[float] = []
        for d in range(iterations):
            started = time.perf_counter()
            yield d
            durations.append(time.perf_counter() - started)
        self._latencies = tuple(durations)

    def getLatency(self) -> tuple[float, float, float]:
        """``(min, max, mean)`` round-trip seconds of the last call's device iterations.

        ``(0.0, 0.0, 0.0)`` before the model has run, as PopTorch's when it has no figures.
        """
        figures = self._latencies
        if not figures:
            return (0.0, 0.0, 0.0)
        return (min(figures), max(figures), sum(figures) / len(figures))

    def _inputs(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call's inputs: generated ones with synthetic data."""
        if self._synthetic is None:
            return args, kwargs
        return self._synthetic.replace(args, kwargs)

    def _collector_for(self, *args: Any) -> OutputCollector:
        anchors = self._anchors
        if anchors is not None and anchors.watches_outputs:
            return _StepCollector(anchors, *args)
        return OutputCollector(*args)

    def _observed_run(self, batch: Batch, run: Callable[[Batch], Any]) -> Any:
        """``run(batch)`` with the anchors kept and the call timed."""
        anchors, throughput = self._anchors, self._throughput
        if anchors is not None:
            if anchors.watches_outputs:
                self._replicas_in_turn()  # the runner may have been replaced (staged)
            anchors.start(batch.iterations, batch.accumulation)
        started = now()
        result = run(batch)
        if throughput is not None:
            micro = batch.batched[0].shape[3]
            throughput.add(
                batch.iterations * batch.accumulation * batch.replicas * micro, now() - started
            )
        if anchors is not None:
            anchors.finish()
        return result

    def _replicas_in_turn(self) -> None:
        if not isinstance(self._runner, LocalReplicaRunner):
            raise ExecutorError(
                "a pipelined model cannot anchor a submodule's output (its stages run in "
                "threads): return the tensor from forward() instead"
            )
        self._runner.run_in_turn()

    def _end_observation(self) -> None:
        if self._anchors is not None:
            self._anchors.remove()
        if self._throughput is not None:
            self._throughput.report()


def _no_anchor(short_name: str) -> Exception:
    return ExecutorError(
        f"getAnchoredTensor({short_name!r}): the model has no anchors; add one with "
        f"opts.anchorTensor({short_name!r}, <tensor name>) before wrapping the model "
        f"(model.getTensorNames() lists the names)"
    )


def _not_synthetic() -> Exception:
    return ExecutorStateError(
        "throughput() measures synthetic-data runs: call opts.enableSyntheticData(True) "
        "before wrapping the model"
    )
