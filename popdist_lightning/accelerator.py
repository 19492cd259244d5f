"""``IPUAccelerator``: Lightning's ``accelerator="ipu"``, one device per local replica.

``Trainer(accelerator="ipu", devices=N)`` asks for ``N`` local replicas in this instance;
``devices="auto"`` takes what poprun gave the instance (1 outside poprun). The replicas
run in this process (popdist_torch's executor), so there is nothing to set up per device.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.accelerators import Accelerator

import popdist
from popdist_lightning.errors import IPUStrategyError

__all__ = ["IPUAccelerator", "parse_devices"]


def parse_devices(devices: Any) -> int:
    """The number of local replicas a ``devices`` flag asks for."""
    if devices in (None, "auto", -1, "-1"):
        return popdist.getNumLocalReplicas()
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    elif isinstance(devices, str) and devices.strip().isdigit():
        count = int(devices)
    elif isinstance(devices, int) and not isinstance(devices, bool):
        count = devices
    else:
        raise IPUStrategyError(
            f"Trainer(accelerator='ipu', devices={devices!r}): expected the number of local "
            f"replicas (an integer >= 1) or 'auto'"
        )
    if count < 1:
        raise IPUStrategyError(
            f"Trainer(accelerator='ipu', devices={devices!r}): expected at least 1 local replica"
        )
    return count


class IPUAccelerator(Accelerator):
    """The "ipu" accelerator: popdist_torch's replicas on this host's CPU (or GPU)."""

    def setup_device(self, device: torch.device) -> None:
        """Nothing to set up: the executor places the replicas."""

    def teardown(self) -> None:
        """Nothing to release."""

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """No per-device statistics."""
        return {}

    @staticmethod
    def parse_devices(devices: Any) -> int:
        """``devices`` as a count of local replicas."""
        return parse_devices(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """One entry per local replica (they all run on this process's device)."""
        return [torch.device("cpu")] * parse_devices(devices)

    @staticmethod
    def auto_device_count() -> int:
        """The local replicas poprun gave this instance (1 outside poprun)."""
        return popdist.getNumLocalReplicas()

    @staticmethod
    def is_available() -> bool:
        """Always: the executor runs on any host."""
        return True

    @staticmethod
    def name() -> str:
        """The accelerator's registered name."""
        return "ipu"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Register as "ipu" (replacing a previous registration of the name)."""
        accelerator_registry.register(
            "ipu",
            cls,
            description="popdist_torch replicas (PopTorch's IPU model on CPU/GPU hosts)",
            override=True,
        )
