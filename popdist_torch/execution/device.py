"""The device side of a ``PoplarExecutor``: attachment, weight copies, random state.

PopTorch's executor owns an IPU: it attaches to and detaches from it, copies weights and
buffers between host and device, and keeps the device's random generator. Here the model
runs where its tensors already are, so this side is bookkeeping: attachment is a recorded
state that the next call re-takes, the copies have nothing to move (the user's module holds
the weights after every call), and the random state is torch's. PopTorch's executable and
profiling methods are refused with their rows' reasons from the surface table
(:mod:`popdist_torch.surface.names`). :class:`~popdist_torch.execution.executor.PoplarExecutor`
keeps what runs a model; this class keeps what PopTorch scripts ask of the device.
"""

from __future__ import annotations

import torch

from popdist_torch.errors import ExecutorStateError
from popdist_torch.surface.names import rows_of
from popdist_torch.surface.rows import install_refusals

__all__ = ["DeviceSide"]


class DeviceSide:
    """Attachment, host/device copies and the random state of one wrapped model."""

    _attached: bool
    _compiled: bool

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
        """Whether the model was called or ``compile()``-d (eager execution compiles nothing)."""
        return self._compiled

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


#: PopTorch's executable, profiling and anchored-tensor methods, refused with their rows'
#: notes (``compileAndExport``, ``save``, ``getLatency``...).
install_refusals(DeviceSide, rows_of("PoplarExecutor"))
