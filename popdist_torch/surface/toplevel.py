"""PopTorch's top-level functions and classes beside the models: hardware queries, logging,
hooks, errors, and the refused names.

Each refused name (``poptorch.load``, ``custom_op``...) is a callable made from its row in
the surface table (:mod:`popdist_torch.surface.names`): reachable, so ``hasattr``, ``dir``
and imports behave, and raising :class:`UnsupportedOptionError` naming what to use when it
is called.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.hooks import RemovableHandle

from popdist_torch.errors import PopdistTorchError, UnsupportedOptionError
from popdist_torch.surface.names import rows_of
from popdist_torch.surface.rows import REFUSED, refusal

__all__ = [
    "IPU_VERSION",
    "LOG_LEVELS",
    "Error",
    "ICustomArgParser",
    "RecoverableError",
    "UnrecoverableError",
    "accessAttributes",
    "ctc_beam_search_decoder",
    "custom_op",
    "fps",
    "getIpuTensorId",
    "importPoptorchMetadataFromFile",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "isRunningOnIpu",
    "load",
    "nearest",
    "registerCustomArgParser",
    "registerPostCompileHook",
    "registerPreCompileHook",
    "run_devices",
    "setLogLevel",
]

log = logging.getLogger("popdist_torch")


#: The IPU version the opt-in answers: a Mk2 (GC200), what PopTorch programs check for.
IPU_VERSION = 2


def _as_if_on_ipus() -> bool:
    """Whether the program asked to run as if on IPUs: the opt-in PopTorch names
    (``poprun --poptorch-modules``, :data:`popdist.env.POPTORCH_MODULES`)."""
    from popdist.env import read_poptorch_modules

    return read_poptorch_modules()


def run_devices() -> int | None:
    """The devices the run has, as the opt-in answers for them: under poprun, its replicas
    times ``--ipus-per-replica``; ``None`` for a process poprun did not launch, which is its
    own run and can give its replicas and stages any number of devices."""
    from popdist.env import read_run

    run = read_run()
    return run.num_total_replicas * run.num_ipus_per_replica if run.from_poprun else None


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    """Whether ``num_ipus`` devices are there.

    Under the opt-in (:func:`popdist.env.read_poptorch_modules`) the program runs as if on a Mk2
    machine that has the run's devices (:func:`run_devices`): ``True`` for 1 up to their
    count. Otherwise ``False``: there are no IPUs, and scripts that branch on it take their
    "no hardware" path, which here runs the same model on the same executor
    (``Options.useIpuModel`` is a no-op).
    """
    if not _as_if_on_ipus() or isinstance(num_ipus, bool) or not isinstance(num_ipus, int):
        return False
    devices = run_devices()
    return num_ipus >= 1 and (devices is None or num_ipus <= devices)


def ipuHardwareVersion() -> int:
    """``2`` (a Mk2) under the opt-in, where optimum-graphcore and Graphcore's applications
    check for it; otherwise refused, as there is no IPU hardware."""
    if _as_if_on_ipus():
        return IPU_VERSION
    raise UnsupportedOptionError(
        "poptorch.ipuHardwareVersion is not supported: there is no IPU hardware here "
        "(popdist_torch runs on CPU or GPU); check poptorch.ipuHardwareIsAvailable() first"
    )


def isRunningOnIpu() -> bool:
    """``False``: forward never runs on an IPU here (PopTorch: ``True`` while compiling)."""
    return False


#: PopTorch's log levels and the ``logging`` level each sets on the ``popdist_torch`` logger.
LOG_LEVELS: dict[str, int] = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERR": logging.ERROR,
    "OFF": logging.CRITICAL + 1,
}
_LEVEL_NUMBERS = {0: "TRACE", 1: "DEBUG", 2: "INFO", 3: "WARN", 4: "ERR", 6: "OFF"}


def setLogLevel(level: str | int) -> None:
    """Set how much ``popdist_torch`` logs: ``TRACE``, ``DEBUG``, ``INFO``, ``WARN``, ``ERR``, ``OFF``.

    PopTorch's integers (0 TRACE ... 4 ERR, 6 OFF) are accepted too.
    """
    name = _LEVEL_NUMBERS.get(level) if isinstance(level, int) else level
    if name not in LOG_LEVELS:
        raise ValueError(
            f"setLogLevel({level!r}): expected one of {', '.join(LOG_LEVELS)} "
            "(or PopTorch's integers 0-4, 6)"
        )
    log.setLevel(LOG_LEVELS[name])


class Error(PopdistTorchError, RuntimeError):
    """PopTorch's base error (raised by its compiler); here so ``except poptorch.Error`` works.

    It sits under the package's one root, :class:`PopdistTorchError`, like every other error here.
    """


class RecoverableError(Error):
    """PopTorch's recoverable runtime error; the executor here never raises it."""


class UnrecoverableError(Error):
    """PopTorch's unrecoverable runtime error; the executor here never raises it."""


_hooks: dict[int, Callable[..., Any]] = {}


def registerPreCompileHook(hook: Callable[..., Any]) -> RemovableHandle:
    """Accepted; never called: there is no compilation step."""
    handle = RemovableHandle(_hooks)
    _hooks[handle.id] = hook
    return handle


def registerPostCompileHook(hook: Callable[..., Any]) -> RemovableHandle:
    """Accepted; never called: there is no compilation step."""
    return registerPreCompileHook(hook)


class ICustomArgParser(abc.ABC):
    """PopTorch's interface for custom input types; see ``registerCustomArgParser``."""

    @abc.abstractmethod
    def yieldTensors(self, struct: Any) -> Iterator[Any]:
        """The tensors of ``struct``, in order."""

    @abc.abstractmethod
    def reconstruct(self, original_structure: Any, tensor_iterator: Iterator[Any]) -> Any:
        """``original_structure`` rebuilt from ``tensor_iterator``."""


_REFUSED = {row.name: row for row in rows_of("poptorch")}


def _refused(name: str) -> Callable[..., Any]:
    """The callable of a refused top-level name, raising its row's note."""
    row = _REFUSED[name]
    if row.status != REFUSED:
        raise TypeError(f"poptorch.{name} is {row.status} in the surface table: write it here")
    return refusal(row)


load = _refused("load")
importPoptorchMetadataFromFile = _refused("importPoptorchMetadataFromFile")
ctc_beam_search_decoder = _refused("ctc_beam_search_decoder")
custom_op = _refused("custom_op")
fps = _refused("fps")
nearest = _refused("nearest")
registerCustomArgParser = _refused("registerCustomArgParser")
accessAttributes = _refused("accessAttributes")
getIpuTensorId = _refused("getIpuTensorId")
