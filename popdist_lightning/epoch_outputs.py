"""Lightning 1.9's ``*_epoch_end(outputs)`` hooks, called on Lightning 2 with the step outputs.

Graphcore's Lightning examples were written for Lightning 1.9, which called
``training_epoch_end(outputs)``, ``validation_epoch_end(outputs)`` and
``test_epoch_end(outputs)`` at the end of each epoch with what every step returned.
Lightning 2 removed them: a module that defines them would run and silently skip them.
Under ``IPUStrategy`` a module that defines one gets :class:`EpochOutputs`, a callback placed
first among the trainer's callbacks that keeps each step's outputs (detached, as Lightning
1.9 kept them) and calls the hook with them at the end of the epoch, before the module's
own ``on_*_epoch_end``, as Lightning 1.9 did; one warning says Lightning 2 removed the hook.
Lightning 2 refuses a module whose hooks it sees, so while the run lasts the callback keeps
them and hides them on the module's instance (restored when the run ends).

The outputs are Lightning 1.9's: ``training_epoch_end`` gets one dict per training step
(``{"loss": <detached loss>, ...}``, what Lightning hands ``on_train_batch_end``);
``validation_epoch_end`` and ``test_epoch_end`` get the values the steps returned
(``None`` left out), one list per dataloader when there are several. A module whose
``on_predict_epoch_end`` takes Lightning 1.9's ``results`` gets the predictions, one list
per dataloader, as 1.9 gave them (Lightning 2 calls it with none).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor

from popdist_lightning.legacy import check_hooks

__all__ = [
    "EPOCH_END_HOOKS",
    "PREDICT_HOOK",
    "EpochOutputs",
    "attach_epoch_outputs",
    "connect_legacy_hooks",
]

#: Lightning 1.9's epoch-end hooks that take the outputs, and the hook each runs in.
EPOCH_END_HOOKS: Mapping[str, str] = {
    "training_epoch_end": "on_train_epoch_end",
    "validation_epoch_end": "on_validation_epoch_end",
    "test_epoch_end": "on_test_epoch_end",
}

#: Lightning 1.9 called ``on_predict_epoch_end(results)`` with the predictions; Lightning 2
#: calls it without them, so a module written for 1.9 fails with a ``TypeError``.
PREDICT_HOOK = "on_predict_epoch_end"


def _loaders(trainer: pl.Trainer) -> int:
    return max(1, len(trainer.num_predict_batches))


def _detached(outputs: Any) -> Any:
    return apply_to_collection(outputs, Tensor, lambda t: t.detach())


class EpochOutputs(pl.Callback):
    """Keeps the step outputs of one epoch and hands them to the module's 1.9 hooks."""

    def __init__(self, module: Any, hooks: tuple[str, ...]) -> None:
        self.hooks = hooks
        self._kept: dict[str, dict[int, list[Any]]] = {}
        # Lightning 2 refuses a module whose instance has the epoch-end names (and calls
        # on_predict_epoch_end without results): the callback keeps the bound hooks and
        # hides them on the instance until the run ends.
        self._bound = {hook: getattr(type(module), hook).__get__(module) for hook in hooks}
        self._module = module
        for hook in hooks:
            module.__dict__[hook] = None

    def _restore(self) -> None:
        for hook in self.hooks:
            self._module.__dict__.pop(hook, None)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore()

    def _keep(self, hook: str, outputs: Any, dataloader_idx: int = 0) -> None:
        if hook in self.hooks and outputs is not None:
            per_loader = self._kept.setdefault(hook, {})
            per_loader.setdefault(dataloader_idx, []).append(_detached(outputs))

    def _call(self, module: pl.LightningModule, hook: str, loaders: int = 1) -> None:
        if hook not in self.hooks:
            return
        kept = self._kept.pop(hook, {})
        if loaders > 1:
            self._bound[hook]([kept.get(i, []) for i in range(loaders)])
        else:
            self._bound[hook](kept.get(0, []))

    # -- training ----------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._kept.pop("training_epoch_end", None)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *args: Any
    ) -> None:
        self._keep("training_epoch_end", outputs)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._call(pl_module, "training_epoch_end")

    # -- validation and test -------------------------------------------------------------
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._kept.pop("validation_epoch_end", None)

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._keep("validation_epoch_end", outputs, dataloader_idx)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._call(pl_module, "validation_epoch_end", len(trainer.num_val_batches))

    def on_predict_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._kept.pop(PREDICT_HOOK, None)

    def on_predict_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._keep(PREDICT_HOOK, outputs, dataloader_idx)

    def on_predict_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if PREDICT_HOOK in self.hooks:  # 1.9: always one list per dataloader
            kept = self._kept.pop(PREDICT_HOOK, {})
            self._bound[PREDICT_HOOK]([kept.get(i, []) for i in range(_loaders(trainer))])

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._kept.pop("test_epoch_end", None)

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._keep("test_epoch_end", outputs, dataloader_idx)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._call(pl_module, "test_epoch_end", len(trainer.num_test_batches))


def attach_epoch_outputs(module: Any, trainer: Any) -> None:
    """Give ``trainer`` an :class:`EpochOutputs` first among its callbacks if ``module`` needs one.

    A callback of an earlier run is replaced (the module may differ); one warning per hook
    says that Lightning 2 removed it.
    """
    hooks = tuple(hook for hook in EPOCH_END_HOOKS if callable(getattr(type(module), hook, None)))
    if _takes_results(getattr(type(module), PREDICT_HOOK, None)):
        hooks += (PREDICT_HOOK,)
    if trainer is None or not (
        hooks or any(isinstance(c, EpochOutputs) for c in trainer.callbacks)
    ):
        return
    callbacks = [c for c in trainer.callbacks if not isinstance(c, EpochOutputs)]
    if hooks:
        callbacks.insert(0, EpochOutputs(module, hooks))
    trainer.callbacks = callbacks
    for hook in hooks:
        if hook == PREDICT_HOOK:
            message = (
                f"{type(module).__name__}.{hook}(results) is Lightning 1.x's form of the hook: "
                f"IPUStrategy calls it with the predictions, one list per dataloader (Lightning "
                f"2 calls {hook}(self), without them)"
            )
        else:
            message = (
                f"{type(module).__name__}.{hook}(outputs) is a Lightning 1.x hook that Lightning "
                f"2 removed: IPUStrategy calls it with the epoch's step outputs, before "
                f"{EPOCH_END_HOOKS[hook]} (on Lightning 2 alone, move it to "
                f"{EPOCH_END_HOOKS[hook]}(self) and keep the outputs yourself)"
            )
        rank_zero_warn(message, category=UserWarning)


def _takes_results(hook: Any) -> bool:
    """Whether ``hook`` (a class's function) needs an argument besides ``self`` (1.9's form)."""
    if not callable(hook):
        return False
    parameters = list(inspect.signature(hook).parameters.values())[1:]
    return any(
        p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in parameters
    )


def connect_legacy_hooks(module: Any, trainer: Any) -> None:
    """When ``IPUStrategy`` connects ``module``: refuse the 1.x hooks Lightning 2 would skip
    (:func:`~popdist_lightning.legacy.check_hooks`), call 1.9's ``*_epoch_end(outputs)``."""
    check_hooks(module, trainer.callbacks if trainer is not None else ())
    attach_epoch_outputs(module, trainer)
