"""PopTorch's ``PoplarExecutor`` methods that have little or nothing to do on torch.

A mixin of :class:`popdist_torch.executor.PoplarExecutor`: device attachment (recorded,
nothing is held), weight copies (the user's module always holds the weights), the random
generator state, and PopTorch's executable/profiling methods, refused with
:class:`~popdist_torch.errors.UnsupportedOptionError` naming what to use instead. Kept
apart so the executor class holds only what runs a model.
"""

from __future__ import annotations

from typing import Any

import torch

from popdist_torch.errors import ExecutorStateError, UnsupportedOptionError

__all__ = ["PopTorchSurface"]


class PopTorchSurface:
    """Attachment, weight copies, RNG state and PopTorch's refused executable methods."""

    _attached: bool

    def _check_alive(self) -> None:
        raise NotImplementedError

    def isAttachedToDevice(self) -> bool:
        """Whether the model holds its device (PopTorch reattaches on the next call)."""
        return self._attached

    def detachFromDevice(self) -> None:
        """Release the device; the next call reattaches."""
        self._check_alive()
        if not self._attached:
            raise ExecutorStateError("detachFromDevice: the model is not attached to a device")
        self._attached = False

    def attachToDevice(self) -> None:
        """Take the device back after ``detachFromDevice``."""
        self._check_alive()
        if self._attached:
            raise ExecutorStateError("attachToDevice: the model is already attached to a device")
        self._attached = True

    def copyWeightsToHost(self) -> None:
        """Nothing to copy: the user's module holds the weights after every call."""
        self._check_alive()

    def copyWeightsToDevice(self) -> None:
        """Nothing to copy: calls read the user's module's weights directly."""
        self._check_alive()

    def isCompiled(self) -> bool:
        """True: eager execution needs no compilation."""
        return True

    @property
    def rng_state(self) -> list[int]:
        """Torch's host random generator state (the device's, as PopTorch's is)."""
        return [int(b) for b in torch.random.get_rng_state().tolist()]

    @rng_state.setter
    def rng_state(self, state: list[int]) -> None:
        torch.random.set_rng_state(torch.tensor(state, dtype=torch.uint8))

    def copyWeightsToHostIfNeeded(self) -> bool:
        """``False``: the host copy (the user's module) is never stale."""
        self._check_alive()
        return False

    def copyNamedBuffersToDevice(self) -> None:
        """Nothing to copy: calls read the module's buffers directly."""
        self._check_alive()

    def compileAndExport(self, filename: str, *args: Any, **kwargs: Any) -> None:
        """There is no executable to export."""
        raise UnsupportedOptionError(
            "compileAndExport is not supported: there is no executable to export; save the "
            "weights and optimizer with popdist_torch.save_checkpoint"
        )

    def loadExecutable(self, filename: str) -> None:
        """There is no executable to load."""
        raise UnsupportedOptionError(
            "loadExecutable is not supported: there is no executable; restore weights with "
            "popdist_torch.load_checkpoint"
        )

    def save(self, filename: str, *args: Any, **kwargs: Any) -> None:
        """PopTorch's executable files do not exist here."""
        raise UnsupportedOptionError(
            "PoplarExecutor.save is not supported: use popdist_torch.save_checkpoint(path, "
            "model, optimizer)"
        )

    def getTensorNames(self) -> list[str]:
        """Anchored tensors are not available (see ``Options.anchorTensor``)."""
        raise UnsupportedOptionError(
            "getTensorNames is not supported: there is no IPU graph; return the tensors "
            "you need from forward()"
        )

    def getAnchoredTensor(self, short_name: str) -> torch.Tensor:
        """Anchored tensors are not available (see ``Options.anchorTensor``)."""
        raise UnsupportedOptionError(
            "getAnchoredTensor is not supported: return the tensor from forward() instead"
        )

    def cycleCount(self) -> int:
        """There are no device cycles."""
        raise UnsupportedOptionError(
            "cycleCount is not supported: there are no IPU cycles; time calls with "
            "time.perf_counter()"
        )

    def compilationTime(self) -> Any:
        """There is no compilation."""
        raise UnsupportedOptionError(
            "compilationTime is not supported: there is no compilation (isCompiled() is True)"
        )

    def getPerfCounters(self) -> dict[str, Any]:
        """There are no host/IPU transfer counters."""
        raise UnsupportedOptionError(
            "getPerfCounters is not supported: there are no IPU transfers; use torch.profiler"
        )

    def getLatency(self) -> Any:
        """There are no host/IPU transfer latencies."""
        raise UnsupportedOptionError(
            "getLatency is not supported: there are no IPU transfers; use torch.profiler"
        )

    getHostIpuLatency = getComputeLatency = getIpuHostLatency = getLatency
