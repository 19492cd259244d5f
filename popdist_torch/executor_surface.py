"""PopTorch's ``PoplarExecutor`` methods that have little or nothing to do on torch.

A mixin of :class:`popdist_torch.executor.PoplarExecutor`: device attachment (recorded,
nothing is held), weight copies (the user's module always holds the weights), the random
generator state, and PopTorch's executable/profiling methods, refused with
:class:`~popdist_torch.errors.UnsupportedOptionError` naming what to use instead (made from
their rows in the surface table, :mod:`popdist_torch.surface.names`). Kept apart so the
executor class holds only what runs a model.
"""

from __future__ import annotations

import torch

from popdist_torch.errors import ExecutorStateError
from popdist_torch.surface.names import rows_of
from popdist_torch.surface.rows import install_refusals

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


#: PopTorch's executable, profiling and anchored-tensor methods, refused with their rows'
#: notes (``compileAndExport``, ``save``, ``getLatency``...).
install_refusals(PopTorchSurface, rows_of("PoplarExecutor"))
