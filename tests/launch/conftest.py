"""The launch tier's checkpoint test runs on both collective backends too."""

from __future__ import annotations

from tests.parallel.conftest import backend

__all__ = ["backend"]
