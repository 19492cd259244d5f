"""The PopTorch surface table: every public PopTorch name and what it does here.

PopTorch 3's public API as its sources and reference documentation define it
(``poptorch/__init__.py``, ``ops.py``, ``options.py``, ``enums.py``), plus the names
PopTorch 2.x deprecated that older scripts still use (``AnchorMode``, ``Options.anchorMode``)
and ``Precision.autocastEnabled``, the PopTorch arguments of ``poptorch.optim``'s
optimizers (owner ``optim``), the read accessors of the options (``opts.device_iterations``),
the operators PopTorch registers with torch (owner ``torch.ops.poptorch``) and the names
PopTorch programs take from ``popart`` (owner ``popart``, :mod:`popdist_torch.popart`). One
row per name (:class:`~popdist_torch.surface.rows.Row`):

- the no-op setters of ``Options``, its groups and ``TensorLocationSettings`` are generated
  from their rows (``record`` says what value they keep for ``toDict()``);
- every refused name, wherever it lives, raises the row's note (an optimizer argument:
  :class:`OptimizerError`, for the values its row's ``when`` names; a ``torch.ops.poptorch``
  operator: its kernel, :mod:`popdist_torch.surface.graph_ops`);
- ``docs/poptorch-names.md`` is rendered from this table
  (``python -m popdist_torch.surface.page``), and a unit test checks the committed page and
  that every row resolves on ``popdist_torch``, ``Options``, its groups and the executor.

Changing what a name does is changing its row: a refused setter becomes a recorded no-op by
giving it ``no_op(..., record=lambda <its arguments>: <value kept>)``.
"""

from __future__ import annotations

from popdist.env import CUDA_GRAPHS, POPTORCH_MODULES
from popdist_torch.enums import HalfFloatCastingBehavior, MeanReductionStrategy
from popdist_torch.surface.rows import Row, no_op, refused, supported, whole_number

__all__ = ["NAMES", "OPTION_OWNERS", "rows_of"]

# fmt: off
P = "poptorch"
MODELS, PARALLEL, OPS, ENUMS = "models", "model parallelism", "operations", "enumerations"
_SAVE = "save with popdist_torch.save_checkpoint and restore with popdist_torch.load_checkpoint"
_NO_IPU = "there are no IPU transfers; use torch.profiler"
_OPT_IN = f"{POPTORCH_MODULES}=1"  # the opt-in PopTorch module names (docs: the module names)
_SETTERS = "call the setters in Python (opts.deviceIterations(4), opts.Training.gradientAccumulation(8), ...)"

TOP_LEVEL: tuple[Row, ...] = (
    supported(P, "trainingModel", "data-parallel executor: local replicas, device iterations, accumulation, Horovod across instances", MODELS),
    supported(P, "inferenceModel", "as `trainingModel`, forward only", MODELS),
    supported(P, "PoplarExecutor", "the wrapper both return; its methods are below", MODELS),
    supported(P, "DataLoader", "combined batches, sharding by process, `Sync`/`Async`/`AsyncRebatched` ([dataloader.md](dataloader.md))", MODELS),
    supported(P, "AsynchronousDataAccessor", "iterates a loader in a background thread, `buffer_size` ahead; other arguments accepted, no effect", MODELS),
    supported(P, "Options", "setters below", MODELS),
    supported(P, "TensorLocationSettings", "methods below", MODELS),
    supported(P, "identity_loss", '`"sum"`, `"mean"`, `"none"`', MODELS),
    supported(P, "optim", "PopTorch's optimizers on torch ([executor.md](executor.md))", MODELS),
    refused(P, "load", f"there are no PopTorch executables; {_SAVE}, then wrap the model again", section=MODELS),
    supported(P, "isRunningOnIpu", "always `False`: forward never runs on an IPU", MODELS),
    supported(P, "ipuHardwareIsAvailable", f"with `{_OPT_IN}`, `ipuHardwareIsAvailable(n)` is `True` where the run has `n` devices; without, always `False` (see Decisions)", MODELS),
    supported(P, "ipuHardwareVersion", f"with `{_OPT_IN}`, `2` (a Mk2); without, raises `UnsupportedOptionError`: \"there is no IPU hardware here (popdist_torch runs on CPU or GPU); check poptorch.ipuHardwareIsAvailable() first\" (see Decisions)", MODELS),
    supported(P, "__version__", f"PopTorch's form, `<release>-<snapshot>`: `3.3.0-popdist.0.1.0` (the PopTorch release whose API this follows, then the project's version); with `{_OPT_IN}`, `importlib.metadata.version(\"poptorch\")` is `3.3.0+popdist.0.1.0`", MODELS),
    supported(P, "setLogLevel", "`TRACE`, `DEBUG`, `INFO`, `WARN`, `ERR`, `OFF` or PopTorch's integers; sets the `popdist_torch` logger", MODELS),
    no_op(P, "registerPreCompileHook", "PopTorch calls the hook before compiling; there is no compilation, so it is never called (a removable handle is returned)", section=MODELS),
    no_op(P, "registerPostCompileHook", "PopTorch calls the hook after compiling; never called, as above", section=MODELS),
    supported(P, "ICustomArgParser", "the abstract class exists; see `registerCustomArgParser`", MODELS),
    refused(P, "registerCustomArgParser", "pass tensors, or tuples, lists and dicts of tensors (they are walked with torch's pytree)", section=MODELS),
    refused(P, "accessAttributes", "attributes of inputs are read in forward as plain Python", section=MODELS),
    refused(P, "getIpuTensorId", "tensors have no IPU ids here", section=MODELS),
    refused(P, "importPoptorchMetadataFromFile", "there are no PopTorch executables to read metadata from", section=MODELS),
    supported(P, "Error", "exception class (`RuntimeError`, under the package root `PopdistTorchError`); the executor raises its own errors (`ExecutorError`, `OptionsError`, `PipelineError`)", MODELS),
    supported(P, "RecoverableError", "subclass of `Error`; never raised here", MODELS),
    supported(P, "UnrecoverableError", "subclass of `Error`; never raised here", MODELS),
    no_op(P, "profiling", "PopTorch writes trace points to a PopVision trace; `profiling.Channel(name).instrument(obj, ...)` returns `obj`, `.tracepoint(name)` times nothing; use `torch.profiler`", section=MODELS),
    # model parallelism
    supported(P, "Block", 'context; `Block("B1")`, `Block(ipu_id=0)`; `Block.useAutoId()` names unnamed blocks `"0"`, `"1"`... ([pipelining.md](pipelining.md))', PARALLEL),
    supported(P, "BeginBlock", "marks a module as the start of a block (a non-module callable is refused: wrap it in a module)", PARALLEL),
    supported(P, "BlockFunction", "decorator: each call runs inside `Block(user_id, ipu_id)`", PARALLEL),
    supported(P, "removeBlocks", "removes the `BeginBlock` marks of a module and its submodules", PARALLEL),
    supported(P, "Stage", '`Stage("B1", "B2").ipu(0)`', PARALLEL),
    supported(P, "Phase", '`Phase(Stage(...), ...)` or `Phase("A", "B")`; `.ipus(...)`, `.stage(i)`', PARALLEL),
    supported(P, "AutoStage", "`SameAsIpu` (default: one stage per `ipu_id`), `AutoIncrement` (one stage per block)", PARALLEL),
    supported(P, "PipelinedExecution", 'stages, block names, lists of block names, or one `AutoStage`; 1F1B schedule (or `schedule="gpipe"`)', PARALLEL),
    supported(P, "ShardedExecution", "one stage at a time", PARALLEL),
    supported(P, "SerialPhasedExecution", "runs as the sharded schedule (see Decisions); `setTensorsLiveness` accepted, no effect", PARALLEL),
    supported(P, "ParallelPhasedExecution", "runs as the sharded schedule; `sendTensorsOffChipAfterFwd` accepted, no effect", PARALLEL),
    supported(P, "PhasedExecution", "the tutorial's name: `SerialPhasedExecution`", PARALLEL),
    # operations
    supported(P, "ipu_print_tensor", "prints the tensor (with its title) when forward runs, and its gradient in the backward pass (as `torch.ops.poptorch.ipu_print_tensor`); returns it", OPS),
    supported(P, "for_loop", "runs the body `count` times in Python", OPS),
    supported(P, "cond", "runs one branch, chosen by the condition's value", OPS),
    supported(P, "nop", "returns its input", OPS),
    supported(P, "dynamic_slice", "`tensor[start:start+size:step]` along `dim`", OPS),
    supported(P, "dynamic_update", "a copy of the input with `src` written at `start`", OPS),
    supported(P, "recomputationCheckpoint", "returns its values (any nesting); a model staged at its blocks as it runs recomputes, with `torch.utils.checkpoint`, each `BeginBlock` module whose output it was given", OPS),
    supported(P, "serializedMatMul", "`lhs @ rhs`, computed whole", OPS),
    no_op(P, "set_available_memory", "PopTorch plans tile memory with it; there are no tiles: returns its tensor", section=OPS),
    no_op(P, "set_overlap_for_input", "PopTorch overlaps host I/O on IO tiles; there are none: returns its tensors", section=OPS),
    no_op(P, "set_overlap_for_output", "as `set_overlap_for_input`", section=OPS),
    supported(P, "CPU", "calls the wrapped function: the whole model already runs on the host", OPS),
    no_op(P, "MultiConv", "PopTorch plans convolutions together; here a context whose planner setters chain and record, convolutions run one by one", section=OPS),
    no_op(P, "NameScope", "PopTorch names graph nodes with it; here a context, there are no graph name scopes", section=OPS),
    no_op(P, "Attribute", "PopTorch attaches attributes (`__outline`...) to the graph operations inside it; there are none: a context that changes nothing", section=OPS),
    refused(P, "custom_op", "there are no Poplar codelets; write the operation in torch inside forward", section=OPS),
    refused(P, "ctc_beam_search_decoder", "decode outside the model (e.g. torchaudio.models.decoder.ctc_decoder)", section=OPS),
    refused(P, "fps", "use torch_cluster.fps (PopTorch Geometric op)", section=OPS),
    refused(P, "nearest", "use torch_cluster.nearest (PopTorch Geometric op)", section=OPS),
    # enumerations: all have PopTorch's members and values
    supported(P, "OutputMode", "`Final`, `EveryN`, `All`, `Sum`, `Default`", ENUMS),
    supported(P, "AnchorMode", "deprecated alias of `OutputMode`, warns on access", ENUMS),
    supported(P, "ReductionType", "`Mean`, `Sum` for gradients; `NoReduction` refused by `accumulationAndReplicationReductionType`", ENUMS),
    supported(P, "MeanReductionStrategy", "every strategy gives the same result here (sum, then divide once); `PostAndLoss` is PopTorch 3's name of the value 2", ENUMS),
    supported(P, "DataLoaderMode", "`Sync`, `Async`, `AsyncRebatched`", ENUMS),
    supported(P, "SharingStrategy", "accepted in `async_options`; workers share tensors the torch way", ENUMS),
    supported(P, "ConnectionType", "for `Options.connectionType` (a no-op)", ENUMS),
    supported(P, "SyncPattern", "for `Options.syncPattern` (a no-op)", ENUMS),
    supported(P, "HalfFloatCastingBehavior", "for `Precision.halfFloatCasting` (a no-op)", ENUMS),
    supported(P, "MatMulSerializationMode", "for `serializedMatMul`", ENUMS),
    supported(P, "Liveness", "for `SerialPhasedExecution.setTensorsLiveness` (no effect)", ENUMS),
    supported(P, "OverlapMode", "for `set_overlap_for_input`/`_output` (no-ops)", ENUMS),
    supported(P, "MultiConvPlanType", "for `MultiConv.planType` (no effect)", ENUMS),
    supported(P, "CommGroupType", "the enumeration exists; replica-grouped variables are not supported", ENUMS),
    supported(P, "VariableRetrievalMode", "the enumeration exists; replica-grouped variables are not supported", ENUMS),
)

IMPL = "poptorch._impl"
_NEVER_WRAPPED = "PopTorch swaps the classes of the user's module, parameters and buffers for its wrappers and back; here the module is never changed"
PRIVATE: tuple[Row, ...] = (
    supported(IMPL, "unwrapModelIfNecessary", f"nothing to do: {_NEVER_WRAPPED}"),
    supported(IMPL, "rewrapModelIfNecessary", f"nothing to do: {_NEVER_WRAPPED}"),
    supported(IMPL, "unwrapIfWrapped", "returns its argument: nothing is wrapped"),
    supported(IMPL, "isWrapped", "`False`: nothing is wrapped"),
    supported(IMPL, "forEachParameterAndBuffer", "`fn(name, tensor)` for every buffer, then every parameter, as PopTorch"),
    supported(IMPL, "createPoptorchError", "a `poptorch.Error` with `type`, `message` and `location`, as PopTorch's"),
    supported(IMPL, "isRunningOnIpu", "as `poptorch.isRunningOnIpu`: `False`"),
)

OPT = "Options"
OPTIONS: tuple[Row, ...] = (
    supported(OPT, "deviceIterations"),
    supported(OPT, "replicationFactor", "local replicas of this process"),
    supported(OPT, "randomSeed", "seeds torch and the DataLoader's shuffling"),
    supported(OPT, "outputMode", "accepts `AnchorMode` values with a warning"),
    supported(OPT, "anchorMode", "deprecated alias of `outputMode`, warns"),
    supported(OPT, "defaultOutputMode"),
    supported(OPT, "defaultAnchorMode", "deprecated alias of `defaultOutputMode`, warns"),
    supported(OPT, "broadcastBuffers"),
    supported(OPT, "enableExecutableCaching", "directory of the executable cache"),
    supported(OPT, "setExecutionStrategy", "any strategy of the table above"),
    supported(OPT, "clone", "a mutable copy"),
    supported(OPT, "toDict"),
    supported(OPT, "exists", "whether a `toDict()` key has a value"),
    # read accessors: PopTorch's options answer their values by name (any `toDict()` key
    # reads as an attribute, `opts("name")` too); these always have one
    supported(OPT, "device_iterations", "read (and assign, as `deviceIterations`)"),
    supported(OPT, "replication_factor", "read (and assign): local replicas; `popdist.poptorch.Options` reads poprun's"),
    supported(OPT, "random_seed", "read (and assign): `None` until `randomSeed` is called"),
    supported(OPT, "output_mode", "read: an `OutputMode` (an integer, as PopTorch's)"),
    supported(OPT, "output_return_period", "read"),
    supported(OPT, "broadcast_buffers", "read (and assign)"),
    supported(OPT, "input_group_size", "read: 1"),
    supported(OPT, "log_dir", 'read: what `logDir` was given (default `"."`)'),
    supported(OPT, "max_repeat_logs", "read: what `maxRepeatLogs` was given (default 4)"),
    supported(OPT, "auto_round_num_ipus", "read: what `autoRoundNumIPUs` was given (default `False`)"),
    supported(OPT, "connection_type", "read: what `connectionType` was given, as an integer (default `Always`)"),
    supported(OPT, "sync_pattern", "read: what `syncPattern` was given, as an integer (default `Full`)"),
    supported(OPT, "available_memory_proportion", "read: what `setAvailableMemoryProportion` was given (default `{}`)"),
    refused(OPT, "inputReplicaGrouping", "only a group size of 1 is supported here; every replica gets its own micro-batch", when=lambda input_group_size, input_group_type=None: input_group_size != 1, when_text="for any size but 1"),
    supported(OPT, "enableSyntheticData", "`True`: a DataLoader reads one sample for the shapes, then yields generated batches; the executor feeds the model generated tensors kept on its device (standard normal; integers zero); throughput in `model.throughput()`"),
    supported(OPT, "anchorTensor", "gradients (`Gradient___<param>`), parameters after the update (`UpdatedVar___<param>` or `<param>`), buffers and submodule outputs (`Output___<module>`), with an output mode ([executor.md](executor.md))"),
    refused(OPT, "enableProfiling", "there is no PopVision profile; use torch.profiler, or popdist_torch.pipeline.record_schedule() for a staged model's schedule"),
    refused(OPT, "loadFromFile", _SETTERS),
    refused(OPT, "from_json", _SETTERS),
    no_op(OPT, "showCompilationProgressBar", "PopTorch shows compilation progress; there is no compilation", lambda show=True: bool(show)),
    no_op(OPT, "logDir", "PopTorch writes compiler logs there; the executor writes none", lambda log_dir: str(log_dir), key="log_dir"),
    no_op(OPT, "logCycleCount", "PopTorch logs device cycles; there are none", lambda log_cycle_count: bool(log_cycle_count), key="log_cycle_count"),
    no_op(OPT, "useIpuModel", "PopTorch simulates an IPU on the host; the model always runs on the host (or GPU)", lambda use_model: bool(use_model), key="use_model"),
    no_op(OPT, "useIpuId", "PopTorch picks a device by id; devices are chosen by the executor", lambda ipu_id: whole_number("useIpuId", ipu_id, minimum=0), key="ipu_id"),
    no_op(OPT, "useOfflineIpuTarget", "PopTorch compiles for an absent IPU; the model runs on this host", lambda ipu_version=2: int(ipu_version), key="ipu_version"),
    no_op(OPT, "autoRoundNumIPUs", "PopTorch rounds the IPU count to a power of two; any number of devices can be used", lambda auto_round: bool(auto_round), key="auto_round_num_ipus"),
    no_op(OPT, "connectionType", "PopTorch defers attaching to hardware; there is no device connection", lambda connection_type: int(connection_type), key="connection_type"),
    no_op(OPT, "syncPattern", "PopTorch's host/device sync pattern; there is none", lambda sync_pattern: int(sync_pattern), key="sync_pattern"),
    no_op(OPT, "setAvailableMemoryProportion", "PopTorch plans tile memory; there is none", lambda available_memory_proportion: dict(available_memory_proportion), key="available_memory_proportion"),
    no_op(OPT, "enableStableNorm", "PopTorch's stable norm computation; torch's norms are stable already", lambda enabled: bool(enabled)),
    no_op(OPT, "sourceLocationExcludes", "PopTorch's compiler source locations; there are none", lambda excludes: list(excludes)),
    no_op(OPT, "appendToLocationExcludes", "as `sourceLocationExcludes`", lambda *excludes: list(excludes)),
    no_op(OPT, "relaxOptimizerAttributesChecks", "PopTorch checks optimizer attributes; any torch optimizer is accepted as it is", lambda relax=True: bool(relax)),
    no_op(OPT, "maxRepeatLogs", "PopTorch limits repeated compiler logs; there are none", lambda max_lines: max_lines, key="max_repeat_logs"),
    no_op(OPT, "modelName", "PopTorch names the compiled executable; there is none to name", lambda name: str(name), key="model_name"),
    no_op(OPT, "disableModuleNamescope", "PopTorch names graph nodes by module; there are no graph name scopes", lambda: True),
    no_op(OPT, "updatableNamedBuffers", "PopTorch lets these buffers be written from the host; every buffer is updatable already", lambda buffers: list(buffers)),
)

T = "Options.Training"
D = "Options.Distributed"
L = "Options.TensorLocations"
PR = "Options.Precision"
PA = "Options._Popart"
GROUPS: tuple[Row, ...] = (
    supported(T, "gradientAccumulation"),
    supported(T, "accumulationAndReplicationReductionType", "`Mean` or `Sum`"),
    supported(T, "gradient_accumulation", "read (and assign): the micro-batches per weight update"),
    supported(T, "accumulation_and_replication_reduction_type", "read (and assign): `ReductionType.Mean` or `Sum`"),
    supported(T, "meanAccumulationAndReplicationReductionStrategy", "read: what `setMeanAccumulationAndReplicationReductionStrategy` was given (default `Post`)"),
    no_op(T, "setMeanAccumulationAndReplicationReductionStrategy", "PopTorch chooses when a mean divides; the executor sums then divides once, which every strategy gives", lambda strategy: MeanReductionStrategy(strategy), key="meanAccumulationAndReplicationReductionStrategy"),
    supported(T, "deterministicReduction", "project extension, not PopTorch's: the sum over replicas is the same bits whatever the split over instances and local replicas (as `poprun --deterministic-reduction`; [executor.md](executor.md))"),
    supported(T, "deterministic_reduction", "project extension: read whether the deterministic reduction is on"),
    supported(T, "cudaGraphs", "project extension, not PopTorch's: `False` runs every training step eagerly on a GPU instead of replaying the captured micro-step (as `" + CUDA_GRAPHS + "=0`; [executor.md](executor.md))"),
    supported(T, "cuda_graphs", "project extension: read whether the training micro-step may be captured in a CUDA graph"),
    no_op(T, "setConvolutionDithering", "an IPU tile-placement choice", lambda enabled: bool(enabled)),
    no_op(T, "setAutomaticLossScaling", "PopTorch adapts a loss scale to keep float16 gradients in range; here float16 models keep float32 optimizer state and updates, and a fixed scale is the optimizer's `loss_scaling`", lambda enabled: bool(enabled), key="automatic_loss_scaling"),
    supported(D, "configureProcessId"),
    supported(D, "setEnvVarNames"),
    supported(D, "disable"),
    supported(D, "processId", "property"),
    supported(D, "numProcesses", "property"),
    supported(D, "num_distributed_processes", "read: the number of processes (PopTorch's value name; under poprun the instance count)"),
    supported(D, "distributed_process_id", "read: this process's index (under poprun the instance index)"),
    supported(L, "setOptimizerLocation", "`useOnChipStorage(False)` keeps optimizer state in host memory between updates; `useReplicatedTensorSharding(True)` shards it over the instances; reads back as `location_optimizer`"),
    no_op(L, "setActivationLocation", "PopTorch keeps activations on or off chip; they stay where torch computes them (kept as `location_activation`)", lambda location: location.toDict(), key="location_activation"),
    no_op(L, "setWeightLocation", "PopTorch keeps weights on or off chip; they stay in the user's module (kept as `location_weight`)", lambda location: location.toDict(), key="location_weight"),
    no_op(L, "setAccumulatorLocation", "PopTorch keeps accumulators on or off chip; accumulated gradients are the parameters' `.grad` (kept as `location_accumulator`)", lambda location: location.toDict(), key="location_accumulator"),
    no_op(L, "numIOTiles", "PopTorch reserves tiles for I/O; there are no IO tiles", lambda num_tiles: whole_number("TensorLocations.numIOTiles", num_tiles, minimum=0)),
    no_op("Options.Jit", "traceModel", "PopTorch traces the model with torch.jit; it always runs eagerly", lambda trace_model: bool(trace_model)),
    no_op(PR, "setPartialsType", "PopTorch's type of matmul and convolution partials; torch computes them in the model's dtype", lambda dtype: str(dtype)),
    no_op(PR, "enableFloatingPointExceptions", "PopTorch traps IPU float exceptions; use `torch.autograd.set_detect_anomaly`", lambda enabled: bool(enabled)),
    no_op(PR, "halfFloatCasting", "PopTorch's float16/float32 casting rule; torch's type promotion applies", lambda behavior: HalfFloatCastingBehavior(behavior)),
    no_op(PR, "runningStatisticsAlwaysFloat", "PopTorch keeps norm statistics in float32; they keep the buffers' dtype", lambda value: bool(value)),
    no_op(PR, "enableStochasticRounding", "an IPU rounding mode; CPUs and GPUs round to nearest", lambda enabled: bool(enabled)),
    supported(PR, "autocastEnabled", "PopTorch 2's automatic half precision: forward passes under `torch.autocast` on the instance's device (bfloat16, or float16 as second argument)"),
    no_op(PA, "set", "a PopART session option (`popdist_torch.popart` has PopART's enumerations for the values); there is no PopART session: kept in `_Popart.options` under its key; a key that is no PopART session option warns once", lambda key, value: {str(key): value}, key=None),
    no_op(PA, "setEngineOptions", "Poplar engine options; there is no Poplar engine (kept as `engineOptions`)", lambda engine_options: dict(engine_options), key="engineOptions"),
    no_op(PA, "setPatterns", "PopART graph patterns; there are none (kept as `patterns` and `patterns_level`)", lambda patterns, level=2: {"patterns": dict(patterns), "patterns_level": int(level)}, key=None),
    supported(PA, "options", "the session options set so far, by PopART name (a `dict`)"),
)

S = "TensorLocationSettings"
LOCATION_SETTINGS: tuple[Row, ...] = (
    supported(S, "useOnChipStorage", "for `setOptimizerLocation`; `toDict()` has PopTorch's keys (`onChip`...)"),
    supported(S, "useReplicatedTensorSharding", "for `setOptimizerLocation`: the optimizer state is sharded over the instances, as torch's `ZeroRedundancyOptimizer` does: each instance keeps and updates the state of its share of the parameters and broadcasts them; the weights are those of the unsharded run, bit for bit (one instance: no effect); `toDict()` has PopTorch's key"),
    no_op(S, "minElementsForOffChip", "PopTorch's on-chip size threshold; there is no on-chip memory", lambda min_elements: min_elements),
    supported(S, "minElementsForReplicatedTensorSharding", "with `useReplicatedTensorSharding(True)`: only the state of parameters with more elements than this is sharded; every instance updates the smaller ones itself"),
    no_op(S, "useIOTilesToLoad", "there are no IO tiles", lambda use=True: bool(use)),
    no_op(S, "useIOTilesToStore", "there are no IO tiles", lambda use=True: bool(use)),
)

E = "PoplarExecutor"
EXECUTOR: tuple[Row, ...] = (
    supported(E, "model", "the user's module, which holds the weights"),
    supported(E, "options"),
    supported(E, "load_state_dict", "the module's own"),
    supported(E, "setOptimizer", "new hyper-parameters from the next call"),
    supported(E, "compile", "checks a batch's shape without running it"),
    supported(E, "isCompiled", "`False` until the first call or `compile()` (which checks a batch's shape; nothing is compiled)"),
    supported(E, "destroy"),
    supported(E, "isAttachedToDevice"),
    supported(E, "detachFromDevice"),
    supported(E, "attachToDevice"),
    supported(E, "rng_state", "torch's random generator state, read and set"),
    no_op(E, "copyWeightsToHost", "PopTorch copies weights from the IPU; the module holds them after every call"),
    no_op(E, "copyWeightsToDevice", "PopTorch copies weights to the IPU; calls read the module's weights"),
    no_op(E, "copyWeightsToHostIfNeeded", "returns `False`: the module is never stale"),
    no_op(E, "copyNamedBuffersToDevice", "PopTorch copies buffers to the IPU; calls read the module's buffers"),
    refused(E, "compileAndExport", "there is no executable to export; save the weights and optimizer with popdist_torch.save_checkpoint"),
    refused(E, "loadExecutable", "there is no executable; restore weights with popdist_torch.load_checkpoint"),
    refused(E, "save", "use popdist_torch.save_checkpoint(path, model, optimizer)"),
    supported(E, "getTensorNames", "the names `anchorTensor` takes: parameters, `Gradient___`/`UpdatedVar___` + parameter, buffers, `Output___` + submodule"),
    supported(E, "getAnchoredTensor", "the anchored tensor after the last call; a gradient is the reduced, unscaled one the optimizer applied ([executor.md](executor.md))"),
    refused(E, "cycleCount", "there are no IPU cycles; time calls with time.perf_counter()"),
    refused(E, "compilationTime", "there is no compilation (isCompiled() says whether the model ran or compile() checked a batch)"),
    refused(E, "getPerfCounters", _NO_IPU),
    supported(E, "getLatency", "`(min, max, mean)` in seconds of the last call's device iterations, each timed on the host from the start of reading its inputs to its outputs kept (training: after the optimizer step); `(0.0, 0.0, 0.0)` before the first call"),
    refused(E, "getHostIpuLatency", _NO_IPU),
    refused(E, "getComputeLatency", _NO_IPU),
    refused(E, "getIpuHostLatency", _NO_IPU),
)

PO = "poptorch.optim"
OPTIMIZERS: tuple[Row, ...] = (
    supported(PO, "SGD", "`torch.optim.SGD` with PopTorch's arguments (below)"),
    supported(PO, "Adam", "`torch.optim.Adam` with PopTorch's arguments"),
    supported(PO, "AdamW", "`torch.optim.AdamW` with PopTorch's arguments"),
    supported(PO, "RMSprop", "`torch.optim.RMSprop` with PopTorch's arguments"),
    supported(PO, "LAMB", "PopTorch's LAMB"),
    supported(PO, "Optimizer", "the base class of every optimizer above: `isinstance(opt, poptorch.optim.Optimizer)`"),
    supported(PO, "VariableAttributes", "the type of `variable_attrs`: `isConstant(attr)`, `markAsConstant(attr)`, `markAsVariable(attr)` (an unknown attribute raises `OptimizerError`)"),
    supported("poptorch.optim.Optimizer", "variable_attrs", "as PopTorch: the attributes passed to the constructor (not `None`) are variable, the others constant; from a training model's first call, changing a constant attribute (in any param group) raises `OptimizerError` naming it and the fix, before the call runs; torch's own optimizers change freely"),
)

M = "optim"
_ACCUM = "float32 by default, so half-precision models keep float32 optimizer state; `torch.float16` stores it in float16 (the update computes in float32)"
OPTIMIZER_ARGUMENTS: tuple[Row, ...] = (
    supported(M, "loss_scaling", "the executor multiplies the loss by it before backward and the optimizer divides the gradients by it before the update (float16 gradients do not flush to zero); `optimizer.loss_scaling` reads and sets it"),
    no_op(M, "velocity_scaling", "(SGD) PopTorch keeps a scaled float16 velocity; the float32 velocity here needs no scaling (checked and kept in each param group)"),
    supported(M, "max_grad_norm", "gradients clipped to this global L2 norm before each update, after unscaling"),
    supported(M, "use_combined_accum", "(SGD) both of PopTorch's SGD variants compute the same update"),
    supported(M, "bias_correction", "(AdamW, LAMB) `False` runs Adam's update without the bias-correction terms"),
    supported(M, "accum_type", f"type of the gradients the update reads: {_ACCUM}"),
    supported(M, "velocity_accum_type", f"(SGD) type of the momentum buffer: {_ACCUM}"),
    supported(M, "first_order_momentum_accum_type", f"type of the first moment (RMSprop: momentum buffer): {_ACCUM}"),
    supported(M, "second_order_momentum_accum_type", f"type of the second moment (RMSprop: mean square): {_ACCUM}"),
    supported(M, "use_tf_variant", "(RMSprop) `True` runs TensorFlow's RMSprop: mean square starting at one, `eps` inside the square root, learning rate in the momentum buffer"),
    supported(M, "max_weight_norm", "(LAMB) cap of the weight norm in LAMB's trust ratio (default 65500)"),
)

TOPS = "torch.ops.poptorch"
_LOOP = "use poptorch.for_loop(count, body, inputs), which runs the body count times"
_COND = "use poptorch.cond(condition, then_body, then_inputs, else_body, else_inputs)"
_CPU = "use poptorch.CPU(layer, ID), which calls the layer on the host"
_CODELETS = "there are no Poplar codelets; write the operation in torch inside forward"
TORCH_OPS: tuple[Row, ...] = (
    no_op(TOPS, "begin_ipu_block", "PopTorch starts a pipeline block; place layers with `poptorch.Block(ipu_id=...)`, `BeginBlock` or `BlockFunction`, which the executor stages"),
    no_op(TOPS, "end_ipu_block", "ends the block `begin_ipu_block` started; as above"),
    no_op(TOPS, "push_name_scope", "PopTorch names graph nodes (`NameScope`); there are no graph name scopes"),
    no_op(TOPS, "pop_name_scope", "as `push_name_scope`"),
    no_op(TOPS, "set_attribute", "PopTorch attaches attributes to graph nodes (outlining); there are no graph nodes"),
    no_op(TOPS, "clear_attribute", "as `set_attribute`"),
    no_op(TOPS, "optimizer_group", "PopTorch maps parameters to the optimizer's groups in its graph; the optimizer's `param_groups` apply as they are"),
    no_op(TOPS, "begin_multi_conv", "PopTorch plans the convolutions up to `end_multi_conv` together; they run one by one"),
    no_op(TOPS, "end_multi_conv", "as `begin_multi_conv`; the planner settings are accepted"),
    supported(TOPS, "nop", "returns its input (PopTorch: a node the compiler keeps)"),
    no_op(TOPS, "recomputation_checkpoint", "returns its input: there is no recomputation"),
    no_op(TOPS, "set_available_memory", "returns its input: there is no tile memory to plan"),
    no_op(TOPS, "set_matmul_serialization", "returns its input: the matmul is computed whole"),
    no_op(TOPS, "set_overlap_for_input", "returns its input: there are no IO tiles"),
    no_op(TOPS, "set_overlap_for_output", "returns its input: there are no IO tiles"),
    supported(TOPS, "ipu_print_tensor", "prints the tensor (after its title) when the model runs, and returns it; with `print_gradient` the backward pass prints the gradient after `<title>_gradient` (not inside the fused replicas' `vmap`); the formatting arguments are accepted"),
    supported(TOPS, "identity_loss", "reduction 0 sum, 1 mean, 2 none, as `poptorch.identity_loss`"),
    supported(TOPS, "dynamic_slice", "as `poptorch.dynamic_slice`"),
    supported(TOPS, "dynamic_update", "as `poptorch.dynamic_update`"),
    refused(TOPS, "start_for_loop", _LOOP),
    refused(TOPS, "end_for_loop", _LOOP),
    refused(TOPS, "start_if_block", _COND),
    refused(TOPS, "start_else_block", _COND),
    refused(TOPS, "end_if_block", _COND),
    refused(TOPS, "call_cpu_op", _CPU),
    refused(TOPS, "end_cpu_op", _CPU),
    refused(TOPS, "custom_operation", _CODELETS),
    refused(TOPS, "ctc_beam_search_decoder", "decode outside the model (e.g. torchaudio.models.decoder.ctc_decoder)"),
    refused(TOPS, "fps", "use torch_cluster.fps (PopTorch Geometric op)"),
    refused(TOPS, "nearest", "use torch_cluster.nearest (PopTorch Geometric op)"),
    refused(TOPS, "nearest_batch_list", "use torch_cluster.nearest (PopTorch Geometric op)"),
)

POP = "popart"
_ENUM = "PopART's members and integer values, for `_Popart.set` (`int(popart.X.Y)`)"
_KEPT = "kept, no effect: there is no PopART session"
POPART: tuple[Row, ...] = (
    *(supported(POP, name, _ENUM) for name in (
        "SyntheticDataMode", "RecomputationType", "RecomputeType", "MergeVarUpdateType",
        "VirtualGraphMode", "AccumulateOuterFragmentSchedule", "SubgraphCopyingStrategy",
        "ReductionType", "MeanReductionStrategy", "BatchSerializationTransformContext",
        "BatchSerializationMethod", "BatchSerializationBatchSchedule", "ExecutionPhaseIOSchedule",
        "ExecutionPhaseSchedule", "TensorStorage", "TileSet", "ReplicatedTensorSharding",
        "PatternsLevel", "SyncPattern", "DataType", "Instrumentation", "IrSerializationFormat",
        "AnchorReturnTypeId", "DeviceConnectionType",
    )),
    no_op(POP, "SessionOptions", f"PopART's session options as attributes (defaults read back, unknown names raise `AttributeError`); {_KEPT}"),
    no_op(POP, "Patterns", f"a level or pattern names; `enablePattern(name, on)` chains; {_KEPT}"),
    no_op(POP, "TensorLocation", f"`TensorLocation(TensorStorage.OffChip)` and PopART's other forms; {_KEPT}"),
    no_op(POP, "TensorLocationSettings", f"`TensorLocationSettings(location or storage, minElementsForOffChip, ...)`; {_KEPT}"),
    no_op(POP, "AccumulateOuterFragmentSettings", _KEPT),
    no_op(POP, "BatchSerializationSettings", _KEPT),
    no_op(POP, "ExecutionPhaseSettings", _KEPT),
    no_op(POP, "AutomaticLossScalingSettings", _KEPT),
    no_op(POP, "getLogger", "`getLogger().setLevel(\"DEBUG\")` keeps the level; PopART logs nothing here"),
    supported(POP, "versionString", "the PopART version whose names and values these follow (also `popart.__version__`)"),
)
# fmt: on

#: Every PopTorch name, top-level names first, then ``poptorch._impl``'s, ``Options`` and its groups,
#: ``TensorLocationSettings``, the executor's methods, the optimizers' arguments, the
#: ``torch.ops.poptorch`` operators and the ``popart`` names.
NAMES: tuple[Row, ...] = (
    *TOP_LEVEL,
    *PRIVATE,
    *OPTIONS,
    *GROUPS,
    *LOCATION_SETTINGS,
    *EXECUTOR,
    *OPTIMIZERS,
    *OPTIMIZER_ARGUMENTS,
    *TORCH_OPS,
    *POPART,
)

#: The owners whose attributes hang off ``Options()``: ``Options`` and its groups.
OPTION_OWNERS: tuple[str, ...] = (OPT, T, D, L, "Options.Jit", PR, "Options._Popart")


def rows_of(owner: str) -> tuple[Row, ...]:
    """The rows of one owner (``"Options.Training"``...), in table order."""
    return tuple(row for row in NAMES if row.owner == owner)
