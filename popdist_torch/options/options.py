"""``Options``: PopTorch's option object, for a data-parallel executor on torch.

Setters return ``self`` so they chain (``Options().deviceIterations(4).randomSeed(0)``);
values are read back through snake_case properties (``opts.device_iterations``).  A
``DataLoader`` freezes the options it is given (as PopTorch does): a setter on frozen
options raises :class:`FrozenOptionsError`; ``clone()`` gives a mutable copy.

An option PopTorch has but that means nothing on this executor is either a documented
no-op (:data:`NO_OP_OPTIONS`, the value is recorded and shows in ``toDict()``) or raises
:class:`UnsupportedOptionError`; a name PopTorch does not have raises ``AttributeError``.
Nothing is silently ignored.
"""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any, TypeVar

from popdist.env import read_cache_dir
from popdist_torch.enums import (
    AnchorMode,
    HalfFloatCastingBehavior,
    MeanReductionStrategy,
    OutputMode,
    ReductionType,
)
from popdist_torch.errors import FrozenOptionsError, OptionsError, UnsupportedOptionError

__all__ = [
    "NO_OP_OPTIONS",
    "DistributedOptions",
    "FrozenOptionsError",
    "Options",
    "OptionsError",
    "TensorLocationSettings",
    "UnsupportedOptionError",
]

#: Options accepted for PopTorch compatibility that change nothing on this executor.
NO_OP_OPTIONS: tuple[str, ...] = (
    "showCompilationProgressBar",
    "logDir",
    "logCycleCount",
    "useIpuModel",
    "useIpuId",
    "autoRoundNumIPUs",
    "connectionType",
    "syncPattern",
    "setAvailableMemoryProportion",
    "enableStableNorm",
    "sourceLocationExcludes",
    "appendToLocationExcludes",
    "relaxOptimizerAttributesChecks",
    "maxRepeatLogs",
    "modelName",
    "useOfflineIpuTarget",
    "disableModuleNamescope",
    "updatableNamedBuffers",
    "Jit.traceModel",
    "Precision.setPartialsType",
    "Precision.enableFloatingPointExceptions",
    "Precision.halfFloatCasting",
    "Precision.runningStatisticsAlwaysFloat",
    "Precision.enableStochasticRounding",
    "Training.setMeanAccumulationAndReplicationReductionStrategy",
    "Training.setConvolutionDithering",
    "TensorLocations.setActivationLocation",
    "TensorLocations.setWeightLocation",
    "TensorLocations.setAccumulatorLocation",
    "TensorLocations.numIOTiles",
    "_Popart.set",
    "_Popart.setEngineOptions",
    "_Popart.setPatterns",
)

_Self = TypeVar("_Self", bound="_OptionGroup")


def _positive_int(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionsError(f"{name}({value!r}): expected an integer >= {minimum}")
    return int(value)


class _OptionGroup:
    """Shared behaviour: a frozen flag, recorded no-op values, ``toDict``."""

    _prefix = ""

    def __init__(self) -> None:
        self._frozen = False
        self._no_ops: dict[str, Any] = {}

    def _check_mutable(self, setter: str) -> None:
        if self._frozen:
            name = f"{self._prefix}{setter}"
            raise FrozenOptionsError(
                f"cannot call {name}: these Options are frozen (a DataLoader was built with "
                f"them); call opts.clone() and change the copy instead"
            )

    def _no_op(self: _Self, setter: str, value: Any) -> _Self:
        self._check_mutable(setter)
        self._no_ops[setter] = value
        return self

    def _freeze(self) -> None:
        self._frozen = True

    def _unfreeze(self) -> None:
        self._frozen = False

    def _values(self) -> dict[str, Any]:
        """Public values of this group, for ``toDict``."""
        raise NotImplementedError

    def toDict(self) -> dict[str, Any]:
        """Every value of this group (and the recorded no-op values), by name."""
        out = self._values()
        out.update(self._no_ops)
        return out

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.toDict().items())
        return f"{type(self).__name__}({fields})"


class _TrainingOptions(_OptionGroup):
    """``opts.Training``: gradient accumulation and how gradients are reduced."""

    _prefix = "Training."

    def __init__(self) -> None:
        super().__init__()
        self._gradient_accumulation = 1
        self._reduction = ReductionType.Mean

    @property
    def gradient_accumulation(self) -> int:
        """Micro-batches whose gradients are accumulated per weight update (default 1)."""
        return self._gradient_accumulation

    @property
    def accumulation_and_replication_reduction_type(self) -> ReductionType:
        """``Mean`` (default) or ``Sum`` over accumulation steps, replicas and instances."""
        return self._reduction

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        """Accumulate the gradients of this many micro-batches per weight update."""
        self._check_mutable("gradientAccumulation")
        self._gradient_accumulation = _positive_int(
            "Training.gradientAccumulation", gradient_accumulation
        )
        return self

    def accumulationAndReplicationReductionType(
        self, reduction_type: ReductionType
    ) -> _TrainingOptions:
        """Reduce gradients over accumulation steps and replicas by ``Mean`` or ``Sum``."""
        self._check_mutable("accumulationAndReplicationReductionType")
        try:
            value = ReductionType(reduction_type)
        except ValueError:
            value = None
        if value not in (ReductionType.Mean, ReductionType.Sum):
            raise OptionsError(
                f"Training.accumulationAndReplicationReductionType({reduction_type!r}): "
                f"expected ReductionType.Mean or ReductionType.Sum"
            )
        self._reduction = value
        return self

    def setMeanAccumulationAndReplicationReductionStrategy(
        self, strategy: MeanReductionStrategy
    ) -> _TrainingOptions:
        """No-op: the executor sums then divides once; every strategy gives that result."""
        return self._no_op(
            "setMeanAccumulationAndReplicationReductionStrategy", MeanReductionStrategy(strategy)
        )

    def setConvolutionDithering(self, enabled: bool) -> _TrainingOptions:
        """No-op: convolution dithering is an IPU tile-placement choice."""
        return self._no_op("setConvolutionDithering", bool(enabled))

    def setAutomaticLossScaling(self, enabled: bool) -> _TrainingOptions:
        """Loss scaling for float16 training: not available (training runs in float32)."""
        raise UnsupportedOptionError(
            "Training.setAutomaticLossScaling is not supported: the executor trains in the "
            "model's own dtype; use torch.amp.GradScaler in your own loop if you need it"
        )

    def _values(self) -> dict[str, Any]:
        return {
            "gradient_accumulation": self._gradient_accumulation,
            "accumulation_and_replication_reduction_type": self._reduction,
        }


class DistributedOptions(_OptionGroup):
    """``opts.Distributed``: which process this is among how many.

    By default this instance's index and the instance count, read through popdist (poprun's
    variables, else Open MPI's rank and size, as PopTorch reads them), so a plain
    ``Options()`` under ``mpirun`` or ``poprun`` already shards data.
    """

    _prefix = "Distributed."

    def __init__(self) -> None:
        super().__init__()
        from popdist.env import read_run

        run = read_run()
        self._num_processes = 1
        self._process_id = 0
        self._configure(run.instance_index, run.num_instances)

    @property
    def processId(self) -> int:
        """Index of this process (0-based)."""
        return self._process_id

    @property
    def numProcesses(self) -> int:
        """Number of processes the run is distributed over."""
        return self._num_processes

    def _configure(self, process_id: int, num_processes: int) -> None:
        num = _positive_int("Distributed.configureProcessId num_processes", num_processes)
        pid = _positive_int("Distributed.configureProcessId process_id", process_id, minimum=0)
        if pid >= num:
            raise OptionsError(
                f"Distributed.configureProcessId({process_id}, {num_processes}): the process "
                f"id must be below the number of processes"
            )
        self._process_id, self._num_processes = pid, num

    def configureProcessId(self, process_id: int, num_processes: int) -> DistributedOptions:
        """Set this process's id and the number of processes (without a launcher's env)."""
        self._check_mutable("configureProcessId")
        self._configure(process_id, num_processes)
        return self

    def setEnvVarNames(self, var_num_processes: str, var_process_id: str) -> DistributedOptions:
        """Read the process count and id from these environment variables now."""
        self._check_mutable("setEnvVarNames")
        from popdist.env import PopdistError, read_process

        try:
            process_id, num_processes = read_process(var_num_processes, var_process_id)
        except PopdistError as exc:
            raise OptionsError(str(exc)) from None
        self._configure(process_id, num_processes)
        return self

    def disable(self) -> DistributedOptions:
        """Run as a single process (id 0 of 1) whatever the environment says."""
        self._check_mutable("disable")
        self._configure(0, 1)
        return self

    def _values(self) -> dict[str, Any]:
        return {
            "num_distributed_processes": self._num_processes,
            "distributed_process_id": self._process_id,
        }


class TensorLocationSettings:
    """Where a class of tensors lives; only ``useOnChipStorage`` has an effect here."""

    def __init__(self) -> None:
        self.on_chip = True

    def useOnChipStorage(self, use: bool = True) -> TensorLocationSettings:
        """``False``: keep the tensors in host memory between weight updates."""
        self.on_chip = bool(use)
        return self

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:
        """Sharding optimizer state over replicas: not available."""
        if use:
            raise UnsupportedOptionError(
                "TensorLocationSettings.useReplicatedTensorSharding(True) is not supported: "
                "every replica keeps the whole optimizer state; leave it off"
            )
        return self

    def minElementsForOffChip(self, min_elements: int) -> TensorLocationSettings:
        """No-op: there is no on-chip memory threshold here."""
        return self

    def minElementsForReplicatedTensorSharding(self, min_elements: int) -> TensorLocationSettings:
        """No-op: replicated tensor sharding is not available (see ``useReplicatedTensorSharding``)."""
        return self

    def useIOTilesToLoad(self, use: bool = True) -> TensorLocationSettings:
        """No-op: there are no IO tiles."""
        return self

    def useIOTilesToStore(self, use: bool = True) -> TensorLocationSettings:
        """No-op: there are no IO tiles."""
        return self

    def __repr__(self) -> str:
        return f"TensorLocationSettings(on_chip={self.on_chip})"


class _TensorLocationOptions(_OptionGroup):
    """``opts.TensorLocations``: where optimizer state is kept between updates."""

    _prefix = "TensorLocations."

    def __init__(self) -> None:
        super().__init__()
        self._optimizer_on_chip = True

    @property
    def optimizer_on_chip(self) -> bool:
        """``False``: optimizer state sits in host memory, moved to the device per update."""
        return self._optimizer_on_chip

    def setOptimizerLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """Keep optimizer state on the device (default) or in host memory."""
        self._check_mutable("setOptimizerLocation")
        if not isinstance(location, TensorLocationSettings):
            raise OptionsError(
                f"TensorLocations.setOptimizerLocation({location!r}): expected a "
                f"TensorLocationSettings, e.g. TensorLocationSettings().useOnChipStorage(False)"
            )
        self._optimizer_on_chip = location.on_chip
        return self

    def setActivationLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """No-op: activations stay where torch computes them."""
        return self._no_op("setActivationLocation", repr(location))

    def setWeightLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """No-op: weights stay in the user's module."""
        return self._no_op("setWeightLocation", repr(location))

    def setAccumulatorLocation(self, location: TensorLocationSettings) -> _TensorLocationOptions:
        """No-op: accumulated gradients are the parameters' ``.grad``."""
        return self._no_op("setAccumulatorLocation", repr(location))

    def numIOTiles(self, num_tiles: int) -> _TensorLocationOptions:
        """No-op: there are no IO tiles."""
        return self._no_op(
            "numIOTiles", _positive_int("TensorLocations.numIOTiles", num_tiles, minimum=0)
        )

    def _values(self) -> dict[str, Any]:
        return {"optimizer_on_chip": self._optimizer_on_chip}


class _JitOptions(_OptionGroup):
    _prefix = "Jit."

    def traceModel(self, trace_model: bool) -> _JitOptions:
        """No-op: the model always runs eagerly."""
        return self._no_op("traceModel", bool(trace_model))

    def _values(self) -> dict[str, Any]:
        return {}


class _PrecisionOptions(_OptionGroup):
    _prefix = "Precision."

    def __init__(self) -> None:
        super().__init__()
        self._autocast = False
        self._autocast_dtype = "bfloat16"  # a name: this module does not import torch

    @property
    def autocast_enabled(self) -> bool:
        """Whether forward passes run under ``torch.autocast`` (half precision)."""
        return self._autocast

    @property
    def autocast_dtype(self) -> str:
        """The half type autocast computes in: ``"bfloat16"`` (default) or ``"float16"``."""
        return self._autocast_dtype

    def autocastEnabled(self, enabled: bool, dtype: Any = None) -> _PrecisionOptions:
        """Run the model's forward passes under ``torch.autocast`` on the instance's device.

        PopTorch's automatic half-precision casting. ``dtype`` is ``torch.bfloat16`` (the
        default: no loss scaling needed) or ``torch.float16``; weights, gradients and the
        optimizer stay in float32. ``torch.autocast`` has no effect inside ``vmap``, so
        with it the local replicas run one after the other.
        """
        self._check_mutable("autocastEnabled")
        if dtype is not None:
            name = str(dtype).removeprefix("torch.")
            if name not in ("bfloat16", "float16", "half"):
                raise OptionsError(
                    f"Precision.autocastEnabled(dtype={dtype!r}): expected torch.bfloat16 or "
                    f"torch.float16"
                )
            self._autocast_dtype = "float16" if name == "half" else name
        self._autocast = bool(enabled)
        return self

    def setPartialsType(self, dtype: Any) -> _PrecisionOptions:
        """No-op: partials are computed in the model's dtype by torch."""
        return self._no_op("setPartialsType", str(dtype))

    def enableFloatingPointExceptions(self, enabled: bool) -> _PrecisionOptions:
        """No-op: use ``torch.autograd.set_detect_anomaly`` to trap NaNs."""
        return self._no_op("enableFloatingPointExceptions", bool(enabled))

    def halfFloatCasting(self, behavior: HalfFloatCastingBehavior) -> _PrecisionOptions:
        """No-op: torch's own type promotion decides float16/float32 mixes."""
        return self._no_op("halfFloatCasting", HalfFloatCastingBehavior(behavior))

    def runningStatisticsAlwaysFloat(self, value: bool) -> _PrecisionOptions:
        """No-op: running statistics keep the dtype of the module's buffers."""
        return self._no_op("runningStatisticsAlwaysFloat", bool(value))

    def enableStochasticRounding(self, enabled: bool) -> _PrecisionOptions:
        """No-op: CPUs and GPUs round to nearest."""
        return self._no_op("enableStochasticRounding", bool(enabled))

    def _values(self) -> dict[str, Any]:
        return {"autocast": self._autocast, "autocast_dtype": self._autocast_dtype}


class _PopartOptions(_OptionGroup):
    """``opts._Popart``: PopART session options; recorded, no effect (there is no PopART)."""

    _prefix = "_Popart."

    def set(self, key: str, value: Any) -> _PopartOptions:
        """No-op: record a PopART option."""
        self._check_mutable("set")
        self._no_ops[str(key)] = value
        return self

    def setEngineOptions(self, engine_options: dict[str, str]) -> _PopartOptions:
        """No-op: there is no Poplar engine."""
        return self._no_op("engine_options", dict(engine_options))

    def setPatterns(self, patterns: dict[str, bool], level: int = 2) -> _PopartOptions:
        """No-op: there are no PopART graph patterns."""
        return self._no_op("patterns", dict(patterns))

    def _values(self) -> dict[str, Any]:
        return {}


class _NoOpSetters(_OptionGroup):
    """PopTorch's top-level setters that mean nothing here: documented, recorded no-ops."""

    def showCompilationProgressBar(self: _Self, show: bool = True) -> _Self:
        """No-op: there is no compilation step to show."""
        return self._no_op("showCompilationProgressBar", bool(show))

    def logDir(self: _Self, log_dir: str) -> _Self:
        """No-op: the executor writes no compiler logs."""
        return self._no_op("logDir", str(log_dir))

    def logCycleCount(self: _Self, log_cycle_count: bool) -> _Self:
        """No-op: there are no device cycles to count."""
        return self._no_op("logCycleCount", bool(log_cycle_count))

    def useIpuModel(self: _Self, use_model: bool) -> _Self:
        """No-op: the executor always runs on the host's CPU (or GPU)."""
        return self._no_op("useIpuModel", bool(use_model))

    def useIpuId(self: _Self, ipu_id: int) -> _Self:
        """No-op: devices are chosen by the executor, not by id."""
        return self._no_op("useIpuId", _positive_int("useIpuId", ipu_id, minimum=0))

    def autoRoundNumIPUs(self: _Self, auto_round: bool) -> _Self:
        """No-op: any number of devices can be used."""
        return self._no_op("autoRoundNumIPUs", bool(auto_round))

    def connectionType(self: _Self, connection_type: Any) -> _Self:
        """No-op: there is no device connection to defer."""
        return self._no_op("connectionType", int(connection_type))

    def syncPattern(self: _Self, sync_pattern: Any) -> _Self:
        """No-op: there is no device/host sync pattern."""
        return self._no_op("syncPattern", int(sync_pattern))

    def setAvailableMemoryProportion(self: _Self, available_memory_proportion: Any) -> _Self:
        """No-op: there is no tile memory to plan."""
        return self._no_op("setAvailableMemoryProportion", dict(available_memory_proportion))

    def enableStableNorm(self: _Self, enabled: bool) -> _Self:
        """No-op: torch's norms are already computed stably."""
        return self._no_op("enableStableNorm", bool(enabled))

    def sourceLocationExcludes(self: _Self, excludes: list[str]) -> _Self:
        """No-op: there are no compiler source locations."""
        return self._no_op("sourceLocationExcludes", list(excludes))

    def appendToLocationExcludes(self: _Self, *excludes: str) -> _Self:
        """No-op: there are no compiler source locations."""
        return self._no_op("appendToLocationExcludes", list(excludes))

    def relaxOptimizerAttributesChecks(self: _Self, relax: bool = True) -> _Self:
        """No-op: any torch optimizer is accepted as it is."""
        return self._no_op("relaxOptimizerAttributesChecks", bool(relax))

    def maxRepeatLogs(self: _Self, max_lines: int | None) -> _Self:
        """No-op: the executor writes no repeated compiler logs."""
        return self._no_op("maxRepeatLogs", max_lines)

    def modelName(self: _Self, name: str) -> _Self:
        """No-op: names nothing here (there is no compiled executable to name)."""
        return self._no_op("modelName", str(name))

    def useOfflineIpuTarget(self: _Self, ipu_version: int = 2) -> _Self:
        """No-op: the model runs on this host; there is no offline compilation target."""
        return self._no_op("useOfflineIpuTarget", int(ipu_version))

    def disableModuleNamescope(self: _Self) -> _Self:
        """No-op: there are no compiler name scopes."""
        return self._no_op("disableModuleNamescope", True)

    def updatableNamedBuffers(self: _Self, buffers: list[str]) -> _Self:
        """No-op: every buffer of the module is updatable already."""
        return self._no_op("updatableNamedBuffers", list(buffers))


class _RefusedSetters(_OptionGroup):
    """PopTorch's top-level setters that cannot be honoured here: each raises, naming why."""

    def enableSyntheticData(self: _Self, enabled: bool) -> _Self:
        """Synthetic data would skip the host data: not available."""
        if enabled:
            raise UnsupportedOptionError(
                "enableSyntheticData(True) is not supported: the executor always uses the "
                "tensors you pass; build random tensors yourself to benchmark without I/O"
            )
        return self

    def anchorTensor(self: _Self, *args: Any, **kwargs: Any) -> _Self:
        """Returning intermediate tensors is not available."""
        raise UnsupportedOptionError(
            "anchorTensor is not supported: return the tensor from forward() instead"
        )

    def enableProfiling(self: _Self, profile_dir: str | None = None) -> _Self:
        """PopVision profiles do not exist here."""
        raise UnsupportedOptionError(
            "enableProfiling is not supported: there is no PopVision profile; use "
            "torch.profiler, or popdist_torch.pipeline.record_schedule() for a staged "
            "model's schedule"
        )

    def loadFromFile(self: _Self, filepath: str) -> _Self:
        """PopTorch's option files are not read."""
        raise UnsupportedOptionError(
            f"loadFromFile({filepath!r}) is not supported: call the setters in Python "
            "(opts.deviceIterations(4), opts.Training.gradientAccumulation(8), ...)"
        )

    def from_json(self: _Self, string: str) -> _Self:
        """PopTorch's JSON option strings are not read."""
        raise UnsupportedOptionError(
            "from_json is not supported: call the setters in Python "
            "(opts.deviceIterations(4), opts.Training.gradientAccumulation(8), ...)"
        )


class Options(_RefusedSetters, _NoOpSetters):
    """PopTorch's options: batching, replication, outputs, distribution, caching."""

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
        self.Training = _TrainingOptions()
        self.Distributed = DistributedOptions()
        self.TensorLocations = _TensorLocationOptions()
        self.Jit = _JitOptions()
        self.Precision = _PrecisionOptions()
        self._Popart = _PopartOptions()

    # -- read properties --------------------------------------------------------------
    @property
    def device_iterations(self) -> int:
        """Weight updates (training) or batches (inference) per model call."""
        return self._device_iterations

    @property
    def replication_factor(self) -> int:
        """Local replicas: model copies of this process."""
        return self._replication_factor

    @property
    def random_seed(self) -> int | None:
        """The seed given to ``randomSeed``, or ``None``."""
        return self._random_seed

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
        self._device_iterations = _positive_int("deviceIterations", device_iterations)
        return self

    def replicationFactor(self, replication_factor: int) -> Options:
        """Number of local replicas (per process, not the global count)."""
        self._check_mutable("replicationFactor")
        self._replication_factor = _positive_int("replicationFactor", replication_factor)
        return self

    def randomSeed(self, random_seed: int) -> Options:
        """Seed torch's generator now, and the DataLoader's shuffling."""
        self._check_mutable("randomSeed")
        self._random_seed = _positive_int("randomSeed", random_seed, minimum=0)
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
            period = _positive_int("outputMode(EveryN, output_return_period)", output_return_period)
        elif output_return_period not in (None, 1):
            raise OptionsError(
                f"outputMode({mode.name}, output_return_period={output_return_period!r}): a "
                f"period only applies to OutputMode.EveryN"
            )
        else:
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

    def inputReplicaGrouping(self, input_group_size: int, input_group_type: Any = None) -> Options:
        """Only a group size of 1 (every replica gets its own data) is supported."""
        self._check_mutable("inputReplicaGrouping")
        if input_group_size != 1:
            raise UnsupportedOptionError(
                f"inputReplicaGrouping({input_group_size!r}): only 1 is supported here; every "
                f"replica gets its own micro-batch"
            )
        return self

    # -- whole-object helpers ---------------------------------------------------------
    def _groups(self) -> tuple[_OptionGroup, ...]:
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
        out = copy.deepcopy(self, memo)
        out._unfreeze()
        return out

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
            "execution_strategy": repr(self._execution_strategy)
            if self._execution_strategy
            else None,
        }

    def toDict(self) -> dict[str, Any]:
        """Every value, with the sub-groups nested under their names (``"Training"``...)."""
        out = super().toDict()
        for name in ("Training", "Distributed", "TensorLocations", "Jit", "Precision"):
            out[name] = getattr(self, name).toDict()
        return out

    def __repr__(self) -> str:
        return f"Options({self.toDict()!r})"


def _warn_anchor(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated (PopTorch 2.4 renamed it): use {new}", FutureWarning, stacklevel=3
    )
