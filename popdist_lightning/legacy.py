"""Lightning 1.x names that Lightning 2 removed, each with its Lightning 2 replacement.

IPU programs were written for Lightning 1.9 (the last release with an IPU strategy); on
Lightning 2 some of their arguments raise a bare ``TypeError`` and some of their hooks are
never called, so a program would run and silently skip them. Here each one is a single
:class:`~popdist_lightning.errors.IPUStrategyError` line naming the replacement (but the
``*_epoch_end(outputs)`` hooks, which are called: :mod:`popdist_lightning.epoch_outputs`):
``Trainer`` arguments through :class:`popdist_lightning.Trainer` (Lightning's Trainer is
not patched), LightningModule and Callback hooks when ``IPUStrategy`` connects a module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from popdist_lightning.errors import IPUStrategyError

__all__ = ["REMOVED_HOOKS", "REMOVED_TRAINER_ARGUMENTS", "check_hooks", "check_trainer_arguments"]

#: ``Trainer(...)`` arguments of Lightning 1.x: what to write on Lightning 2
#: (``{value}`` is the value given).
REMOVED_TRAINER_ARGUMENTS: Mapping[str, str] = {
    "ipus": "Trainer(accelerator='ipu', devices={value})",
    "gpus": "Trainer(accelerator='gpu', devices={value})",
    "tpus": "Trainer(accelerator='tpu', devices={value})",
    "num_processes": "Trainer(accelerator='cpu', devices={value})",
    "progress_bar_refresh_rate": (
        "callbacks=[TQDMProgressBar(refresh_rate={value})] (from lightning.pytorch.callbacks; "
        "enable_progress_bar=False for none)"
    ),
    "process_position": "callbacks=[TQDMProgressBar(process_position={value})]",
    "resume_from_checkpoint": "trainer.fit(model, ckpt_path={value!r})",
    "checkpoint_callback": "Trainer(enable_checkpointing={value})",
    "weights_summary": "Trainer(enable_model_summary=...) or callbacks=[ModelSummary(max_depth=...)]",
    "weights_save_path": "callbacks=[ModelCheckpoint(dirpath={value!r})]",
    "replace_sampler_ddp": "Trainer(use_distributed_sampler={value})",
    "reload_dataloaders_every_epoch": "Trainer(reload_dataloaders_every_n_epochs=1)",
    "auto_select_gpus": "Trainer(devices='auto') (or lightning.pytorch.accelerators.find_usable_cuda_devices)",
    "auto_lr_find": "lightning.pytorch.tuner.Tuner(trainer).lr_find(model)",
    "auto_scale_batch_size": "lightning.pytorch.tuner.Tuner(trainer).scale_batch_size(model)",
    "track_grad_norm": (
        "lightning.pytorch.utilities.grad_norm(self, norm_type=...) logged in "
        "on_before_optimizer_step"
    ),
    "amp_backend": "Trainer(precision=...) (apex was removed)",
    "amp_level": "Trainer(precision=...) (apex was removed)",
    "terminate_on_nan": "Trainer(detect_anomaly=True) or EarlyStopping(check_finite=True)",
    "stochastic_weight_avg": "callbacks=[StochasticWeightAveraging(swa_lrs=...)]",
    "log_gpu_memory": "callbacks=[DeviceStatsMonitor()]",
    "flush_logs_every_n_steps": "the logger's flush_logs_every_n_steps (e.g. CSVLogger)",
    "move_metrics_to_cpu": "nothing (Lightning 2 dropped it): remove the argument",
    "multiple_trainloader_mode": "CombinedLoader(loaders, mode={value!r}) from train_dataloader",
    "prepare_data_per_node": "the LightningModule/DataModule attribute prepare_data_per_node",
    "truncated_bptt_steps": "manual optimization that splits the sequence in training_step",
}

#: LightningModule and Callback hooks of Lightning 1.x that Lightning 2 no longer calls.
#: (``training_epoch_end``, ``validation_epoch_end`` and ``test_epoch_end`` are called,
#: with the step outputs: :mod:`popdist_lightning.epoch_outputs`.)
REMOVED_HOOKS: Mapping[str, str] = {
    "training_step_end": "training_step (do the work there; IPUStrategy averages its loss)",
    "validation_step_end": "validation_step (do the work there)",
    "test_step_end": "test_step (do the work there)",
    "on_epoch_start": "on_train_epoch_start / on_validation_epoch_start",
    "on_epoch_end": "on_train_epoch_end / on_validation_epoch_end",
    "on_batch_start": "on_train_batch_start",
    "on_batch_end": "on_train_batch_end",
    "on_pretrain_routine_start": "on_fit_start",
    "on_pretrain_routine_end": "on_fit_start",
    "on_init_start": "nothing (Lightning 2 dropped it): do it before Trainer(...)",
    "on_init_end": "nothing (Lightning 2 dropped it): do it after Trainer(...)",
    "on_keyboard_interrupt": "on_exception(self, trainer, module, exception)",
    "on_hpc_save": "on_save_checkpoint",
    "on_hpc_load": "on_load_checkpoint",
    "get_progress_bar_dict": "TQDMProgressBar.get_metrics (a subclass in callbacks=[...])",
}


def check_trainer_arguments(arguments: Mapping[str, Any]) -> None:
    """Refuse the first ``Trainer`` argument Lightning 2 removed, naming its replacement."""
    for name, value in arguments.items():
        replacement = REMOVED_TRAINER_ARGUMENTS.get(name)
        if replacement is not None:
            raise IPUStrategyError(
                f"Trainer({name}={value!r}) is a Lightning 1.x argument that Lightning 2 "
                f"removed: use {replacement.format(value=value)}"
            )


def check_hooks(module: Any, callbacks: Iterable[Any] = ()) -> None:
    """Refuse a removed Lightning 1.x hook on ``module`` or a callback, naming its replacement.

    Lightning 2 does not define these names, so any callable of that name is the user's.
    """
    for owner, kind in [(module, "LightningModule"), *((c, "callback") for c in callbacks)]:
        for hook, replacement in REMOVED_HOOKS.items():
            if callable(getattr(owner, hook, None)):
                raise IPUStrategyError(
                    f"{type(owner).__name__}.{hook} is a Lightning 1.x {kind} hook that "
                    f"Lightning 2 no longer calls: use {replacement}"
                )
