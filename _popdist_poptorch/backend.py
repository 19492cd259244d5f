"""The project's build backend: setuptools', plus the opt-in's ``.pth`` in every wheel.

``pyproject.toml`` names this module (``backend-path = ["."]``). Every hook is setuptools'
own; :func:`build_wheel` and :func:`build_editable` then add :data:`~_popdist_poptorch.PTH_NAME`
at the wheel's root (with its ``RECORD`` line), so that ``pip install`` of the wheel and
``pip install -e .`` (any ``editable_mode``, ``compat`` included) both put it in
site-packages. Its line imports :mod:`_popdist_poptorch` only where
``POPDIST_POPTORCH_MODULES`` is set.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every other hook is setuptools')

from _popdist_poptorch import PTH_LINE, PTH_NAME

__all__ = [*_setuptools.__all__, "add_pth"]


def add_pth(wheel: str) -> None:
    """Add the opt-in's ``.pth`` at the root of ``wheel`` and its line to the wheel's RECORD."""
    data = PTH_LINE.encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    rewritten = f"{wheel}.tmp"
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(rewritten, "w") as out:
        for item in source.infolist():
            if item.filename == PTH_NAME:
                continue
            content = source.read(item.filename)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = [
                    ln
                    for ln in content.decode().splitlines()
                    if ln and not ln.startswith(f"{PTH_NAME},")
                ]
                lines.insert(0, f"{PTH_NAME},sha256={digest},{len(data)}")
                content = ("\n".join(lines) + "\n").encode()
                out.writestr(_entry(PTH_NAME, item), data, zipfile.ZIP_DEFLATED)
            out.writestr(item, content, zipfile.ZIP_DEFLATED)
    os.replace(rewritten, wheel)


def _entry(name: str, like: zipfile.ZipInfo) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=like.date_time)
    info.external_attr = 0o644 << 16
    return info


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    name: str = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_pth(os.path.join(wheel_directory, name))
    return name


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    add_pth(os.path.join(wheel_directory, name))
    return name
