"""``Options``: PopTorch's option object, for a data-parallel executor on torch.

Setters return ``self`` so they chain (``Options().deviceIterations(4).randomSeed(0)``);
values are read back through snake_case properties (``opts.device_iterations``).  A
``DataLoader`` freezes the options it is given (as PopTorch does): a setter on frozen
options raises :class:`FrozenOptionsError`; ``clone()`` gives a mutable copy.

This class holds the top-level settings; its groups (``Training``, ``Distributed``,
``TensorLocations``, ``Jit``, ``Precision``, ``_Popart``) live in modules of their own. A
setter PopTorch has but that means nothing here is a recorded no-op or a refusal generated
from its row in the surface table (:mod:`popdist_torch.surface.names`); a name PopTorch
does not have raises ``AttributeError``. Nothing is silently ignored.
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from typing import Any

from popdist.env import read_cache_dir
from popdist_torch.enums import AnchorMode, ConnectionType, OutputMode, SyncPattern
from popdist_torch.errors import OptionsError
from popdist_torch.options.compiler import JitOptions, PopartOptions
from popdist_torch.options.distributed import DistributedOptions
from popdist_torch.options.group import OptionGroup, install_setters
from popdist_torch.options.observing import ObservingOptions
from popdist_torch.options.precision import PrecisionOptions
from popdist_torch.options.tensor_locations import TensorLocationOptions
from popdist_torch.options.training import TrainingOptions
from popdist_torch.surface.rows import whole_number

log = logging.getLogger("popdist_torch.options")

__all__ = ["Options"]


@install_setters
class Options(ObservingOptions):
    """PopTorch's options: batching, replication, outputs, distribution, caching."""

    _owner = "Options"

    def __init__(self) -> None:
        super().__init__()
        self._device_iterations = 1
        self._replication_factor = 1
        self._random_seed: int | None = None
        self._output_mode = OutputMode.Default
        self._output_return_period = 1
        self._broadcast_buffers = True
        self._executable_cache_dir: str | None = read_cache_dir()
        self._execution_strategy: Any = None
        self._ipus_per_replica: int | None = None
        self.Training = TrainingOptions()
        self.Distributed = DistributedOptions()
        self.TensorLocations = TensorLocationOptions()
        self.Jit = JitOptions()
        self.Precision = PrecisionOptions()
        self._Popart = PopartOptions()

    # -- read properties --------------------------------------------------------------
    @property
    def device_iterations(self) -> int:
        """Weight updates (training) or batches (inference) per model call."""
        return self._device_iterations

    @device_iterations.setter
    def device_iterations(self, value: int) -> None:
        """``opts.device_iterations = 4``: PopTorch's assignment form of ``deviceIterations``."""
        self.deviceIterations(value)

    @property
    def replication_factor(self) -> int:
        """Local replicas: model copies of this process."""
        return self._replication_factor

    @replication_factor.setter
    def replication_factor(self, value: int) -> None:
        """``opts.replication_factor = 2``: as ``replicationFactor(2)``."""
        self.replicationFactor(value)

    @property
    def random_seed(self) -> int | None:
        """The seed given to ``randomSeed``, or ``None``."""
        return self._random_seed

    @random_seed.setter
    def random_seed(self, value: int) -> None:
        """``opts.random_seed = 0``: as ``randomSeed(0)``."""
        self.randomSeed(value)

    @property
    def output_mode(self) -> OutputMode:
        """Which outputs a call returns (``Default`` until the model resolves it)."""
        return self._output_mode

    @property
    def output_return_period(self) -> int:
        """N of ``OutputMode.EveryN``."""
        return self._output_return_period

    @property
    def broadcast_buffers(self) -> bool:
        """Whether buffers (BatchNorm statistics) are broadcast from instance 0."""
        return self._broadcast_buffers

    @broadcast_buffers.setter
    def broadcast_buffers(self, value: bool) -> None:
        """``opts.broadcast_buffers = False``: as ``broadcastBuffers(False)``."""
        self.broadcastBuffers(value)

    @property
    def executable_cache_dir(self) -> str | None:
        """Directory of the executable cache, or ``None``."""
        return self._executable_cache_dir

    @property
    def ipus_per_replica(self) -> int | None:
        """Devices of one replica, or ``None``: as many as the model's stages name.

        ``popdist.poptorch.Options`` sets it from the launch (``--ipus-per-replica``).
        """
        return self._ipus_per_replica

    @property
    def execution_strategy(self) -> Any:
        """The strategy given to ``setExecutionStrategy`` (``None``: data parallel only)."""
        return self._execution_strategy

    # -- setters ----------------------------------------------------------------------
    def deviceIterations(self, device_iterations: int) -> Options:
        """Run this many iterations per call before returning to the caller."""
        self._check_mutable("deviceIterations")
        self._device_iterations = whole_number("deviceIterations", device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> Options:
        """Number of local replicas (per process, not the global count)."""
        self._check_mutable("replicationFactor")
        self._replication_factor = whole_number("replicationFactor", replication_factor)
        return self

    def randomSeed(self, random_seed: int) -> Options:
        """Seed torch's generator now, and the DataLoader's shuffling."""
        self._check_mutable("randomSeed")
        self._random_seed = whole_number("randomSeed", random_seed, minimum=0)
        import torch  # lazily: options are cheap to build

        torch.manual_seed(self._random_seed)
        return self

    def outputMode(
        self, output_mode: OutputMode, output_return_period: int | None = None
    ) -> Options:
        """Which outputs to return: ``Final``, ``EveryN`` (with a period), ``All``, ``Sum``, ``Default``."""
        self._check_mutable("outputMode")
        if isinstance(output_mode, AnchorMode):
            _warn_anchor("outputMode(AnchorMode...)", "outputMode(poptorch.OutputMode...)")
        try:
            mode = OutputMode(output_mode)
        except ValueError:
            raise OptionsError(
                f"outputMode({output_mode!r}): expected an OutputMode "
                f"({', '.join(m.name for m in OutputMode)})"
            ) from None
        if mode == OutputMode.EveryN:
            period = whole_number("outputMode(EveryN, output_return_period)", output_return_period)
        else:  # as PopTorch: a period outside EveryN is ignored, with a note
            if output_return_period not in (None, 1):
                log.info(
                    "outputMode(%s, output_return_period=%r): the period is ignored, it only "
                    "applies to OutputMode.EveryN",
                    mode.name,
                    output_return_period,
                )
            period = 1
        self._output_mode, self._output_return_period = mode, period
        return self

    def anchorMode(
        self, anchor_mode: AnchorMode | OutputMode, anchor_return_period: int | None = None
    ) -> Options:
        """PopTorch's deprecated name of ``outputMode`` (warns, then sets the output mode)."""
        _warn_anchor("Options.anchorMode", "Options.outputMode")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # one warning per call, not two
            return self.outputMode(OutputMode(int(anchor_mode)), anchor_return_period)

    def defaultAnchorMode(self) -> bool:
        """PopTorch's deprecated name of ``defaultOutputMode`` (warns)."""
        _warn_anchor("Options.defaultAnchorMode", "Options.defaultOutputMode")
        return self.defaultOutputMode()

    def exists(self, option: str) -> bool:
        """Whether ``option`` (a ``toDict()`` key such as ``"random_seed"``) has a value."""
        return self.toDict().get(option) is not None

    def broadcastBuffers(self, broadcast_buffers: bool = True) -> Options:
        """Broadcast buffers from instance 0 at wrap time (default ``True``)."""
        self._check_mutable("broadcastBuffers")
        self._broadcast_buffers = bool(broadcast_buffers)
        return self

    def enableExecutableCaching(self, path: str | os.PathLike[str] | None) -> Options:
        """Directory of the executable cache (``None`` disables it)."""
        self._check_mutable("enableExecutableCaching")
        self._executable_cache_dir = os.fspath(path) if path else None
        return self

    def setExecutionStrategy(self, strategy: Any) -> Options:
        """Split each replica over devices: ``PipelinedExecution`` or ``ShardedExecution``."""
        self._check_mutable("setExecutionStrategy")
        from popdist_torch.pipeline import PipelinedExecution, ShardedExecution

        if strategy is not None and not isinstance(
            strategy, (PipelinedExecution, ShardedExecution)
        ):
            raise OptionsError(
                f"setExecutionStrategy({strategy!r}): expected a PipelinedExecution, "
                f"ShardedExecution, SerialPhasedExecution or ParallelPhasedExecution"
            )
        self._execution_strategy = strategy
        return self

    # -- whole-object helpers ---------------------------------------------------------
    def _groups(self) -> tuple[OptionGroup, ...]:
        return (
            self.Training,
            self.Distributed,
            self.TensorLocations,
            self.Jit,
            self.Precision,
            self._Popart,
        )

    def _freeze(self) -> None:
        """Forbid further changes (a DataLoader relies on the batch arithmetic)."""
        super()._freeze()
        for group in self._groups():
            group._freeze()

    def _unfreeze(self) -> None:
        super()._unfreeze()
        for group in self._groups():
            group._unfreeze()

    @property
    def is_frozen(self) -> bool:
        """Whether setters raise (see ``_freeze``)."""
        return self._frozen

    def clone(self) -> Options:
        """A mutable copy (the execution strategy object is shared, not copied)."""
        memo = {id(self._execution_strategy): self._execution_strategy}
        return copy.deepcopy(self, memo)

    def defaultOutputMode(self) -> bool:
        """Whether the output mode is still ``Default`` (resolved per model kind)."""
        return self._output_mode == OutputMode.Default

    def _values(self) -> dict[str, Any]:
        return {
            "device_iterations": self._device_iterations,
            "replication_factor": self._replication_factor,
            "random_seed": self._random_seed,
            "output_mode": self._output_mode,
            "output_return_period": self._output_return_period,
            "broadcast_buffers": self._broadcast_buffers,
            "executable_cache_dir": self._executable_cache_dir,
            "ipus_per_replica": self._ipus_per_replica,
            **self._observing_values(),
            "execution_strategy": repr(self._execution_strategy)
            if self._execution_strategy
            else None,
            **_NO_OP_DEFAULTS,
            "available_memory_proportion": {},
        }

    def toDict(self) -> dict[str, Any]:
        """Every value, with the sub-groups nested under their names (``"Training"``...)."""
        out = super().toDict()
        for name in ("Training", "Distributed", "TensorLocations", "Jit", "Precision", "_Popart"):
            out[name] = getattr(self, name).toDict()
        return out

    def __repr__(self) -> str:
        return f"Options({self.toDict()!r})"


#: PopTorch's defaults of the values its no-op setters record (``opts.log_dir`` is ``"."``
#: until ``logDir`` is called), by PopTorch's names.
_NO_OP_DEFAULTS: dict[str, Any] = {
    "log_dir": ".",
    "max_repeat_logs": 4,
    "auto_round_num_ipus": False,
    "connection_type": int(ConnectionType.Always),
    "sync_pattern": int(SyncPattern.Full),
    "input_group_size": 1,
}


def _warn_anchor(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated (PopTorch 2.4 renamed it): use {new}", FutureWarning, stacklevel=3
    )
