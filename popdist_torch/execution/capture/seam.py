"""Capture and replay: the one seam between the graphed step and the device.

A :class:`GraphBackend` records a step and replays it on the same buffers:

- :class:`CudaGraphs` (a GPU): ``torch.cuda.CUDAGraph``, captured on a side stream of its
  own (``capture_error_mode="thread_local"``, so that another thread's CUDA calls, a
  loader's, do not spoil a capture), each graph in its own memory pool; the eager warm-up
  steps run on the same stream, as torch's whole-network capture asks;
- :class:`RerunGraphs` (the CPU, for tests): a replay runs the recorded step again on the
  same static buffers and copies its outputs into the captured ones, and checks that
  every address the step writes to is still the one it wrote to at capture, which a CUDA
  replay would silently keep writing to.

:data:`BACKENDS` maps a device type to its backend; only ``"cuda"`` is there, so the CPU
path never captures unless a test registers :class:`RerunGraphs` for ``"cpu"``.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from popdist_torch.errors import ExecutorError

__all__ = ["BACKENDS", "CudaGraphs", "Graph", "GraphBackend", "RerunGraphs", "backend_for"]

#: The addresses a captured step reads and writes (static inputs, ``.grad`` buffers...).
Addresses = Callable[[], tuple[int, ...]]


class Graph(abc.ABC):
    """One captured step: :meth:`replay` runs it again, rewriting its static outputs."""

    @abc.abstractmethod
    def replay(self) -> None:
        """Run the captured step on its static buffers."""


class GraphBackend(abc.ABC):
    """How one device captures and replays a step."""

    replays = 0  # replays so far (tests read it)

    @abc.abstractmethod
    def warming(self) -> contextlib.AbstractContextManager[None]:
        """Around an eager step run before a capture (the warm-up calls)."""

    @abc.abstractmethod
    def capture(self, step: Callable[[], Any], addresses: Addresses) -> tuple[Graph, Any]:
        """Record ``step``, run it once, and return the graph and ``step``'s outputs, the
        static outputs every replay rewrites. ``addresses`` gives the addresses the step
        uses (a replay uses the captured ones whatever the tensors hold by then)."""


class _Rerun(Graph):
    def __init__(
        self, backend: RerunGraphs, step: Callable[[], Any], outputs: Any, addresses: Addresses
    ) -> None:
        self._backend, self._step, self._outputs = backend, step, outputs
        self._addresses, self._captured = addresses, addresses()

    def replay(self) -> None:
        if self._addresses() != self._captured:
            raise ExecutorError(
                "a captured step's buffers moved since its capture (a replay on a GPU would "
                "write to the old ones): this is a bug of popdist_torch's graphed step"
            )
        fresh = tree_leaves(self._step())
        for static, value in zip(tree_leaves(self._outputs), fresh, strict=True):
            static.copy_(value)
        self._backend.replays += 1


class RerunGraphs(GraphBackend):
    """The CPU stand-in: a capture runs the step once and a replay runs it again."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.captures = 0

    def warming(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def capture(self, step: Callable[[], Any], addresses: Addresses) -> tuple[Graph, Any]:
        outputs = step()
        self.captures += 1
        return _Rerun(self, step, outputs, addresses), outputs


class _Cuda(Graph):
    def __init__(self, backend: CudaGraphs, graph: Any) -> None:
        self._backend, self._graph = backend, graph

    def replay(self) -> None:
        self._graph.replay()
        self._backend.replays += 1


class CudaGraphs(GraphBackend):
    """CUDA graphs on ``device``, captured and warmed up on one side stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]
        self.captures = 0

    @contextlib.contextmanager
    def warming(self) -> Iterator[None]:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        try:
            with torch.cuda.stream(self.stream):
                yield
        except BaseException:  # later work on the caller's stream waits for the step's too
            with contextlib.suppress(Exception):  # the step's error is the one to see
                current.wait_stream(self.stream)
            raise
        current.wait_stream(self.stream)

    def capture(self, step: Callable[[], Any], addresses: Addresses) -> tuple[Graph, Any]:
        graph = torch.cuda.CUDAGraph()
        caller = torch.cuda.current_stream()  # of this thread's current device
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        try:
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                outputs = step()
        except BaseException:
            with contextlib.suppress(Exception):  # the capture's error is the one to see
                torch.cuda.synchronize(self.device)
            raise
        finally:  # torch.cuda.graph leaves the side stream current when capture_end raises
            torch.cuda.set_stream(current)
            torch.cuda.set_stream(caller)  # and the caller's device, as torch.cuda.stream does
        self.captures += 1
        graph.replay()  # the capture recorded the step; this runs it, once
        return _Cuda(self, graph), outputs


#: The graph backend of each device type that has one.
BACKENDS: dict[str, Callable[[torch.device], GraphBackend]] = {"cuda": CudaGraphs}


def backend_for(device: torch.device) -> Callable[[torch.device], GraphBackend] | None:
    """The graph backend of ``device``'s type, or None (the device cannot capture)."""
    return BACKENDS.get(device.type)
