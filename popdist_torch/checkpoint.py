"""Atomic, weights-only checkpoints of a distributed run.

:func:`save_checkpoint` writes on instance 0 only; the other instances wait until the file
is complete (and learn whether the save worked). The file is written next to its final
name, flushed, fsync'ed and renamed over it, then the directory is fsync'ed: a crash or
SIGKILL at any moment leaves either the previous checkpoint or the new one, never a torn
file. New files honour the umask and are never world-writable.

:func:`load_checkpoint` runs on every instance and reads with ``torch.load(...,
weights_only=True)``, so a checkpoint cannot execute code. Everything saved is therefore
plain data: tensors, numbers, strings, lists, tuples and dicts; random-number-generator
states are stored as tensors and tuples.
"""

from __future__ import annotations

import os
import random
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from popdist_torch.errors import CheckpointError

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint"]

FORMAT = "popdist_torch.checkpoint/1"
_TEMP_MARK = ".tmp-"
#: Never create checkpoint files writable by others, whatever the umask allows.
_NEVER = 0o002


class _Stateful(Protocol):
    def state_dict(self) -> Mapping[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> Any: ...


# -- RNG state as weights-only data ------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """The torch, Python and (if imported) NumPy generator states, as plain data."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    numpy = _numpy()
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = {
            "name": str(name),
            "keys": torch.from_numpy(keys.astype(numpy.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the states saved by :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = _numpy()
    saved = state.get("numpy")
    if numpy is not None and saved is not None:
        numpy.random.set_state(
            (
                saved["name"],
                saved["keys"].numpy().astype(numpy.uint32),
                saved["pos"],
                saved["has_gauss"],
                saved["cached_gaussian"],
            )
        )


def _numpy() -> Any:
    import sys

    return sys.modules.get("numpy")  # only if the program uses NumPy already


# -- atomic file writing ---------------------------------------------------------------------


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_temporaries(path: Path) -> None:
    """Delete temporary files of earlier saves to ``path`` whose writer is gone."""
    prefix = f".{path.name}{_TEMP_MARK}"
    for entry in path.parent.glob(f"{prefix}*"):
        pid_text = entry.name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            entry.unlink(missing_ok=True)
        except PermissionError:  # alive, someone else's
            continue


def atomic_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save(obj, path)`` that never leaves a partial file at ``path``."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise CheckpointError(
            f"cannot save checkpoint {target}: directory {directory} does not exist"
        )
    _remove_stale_temporaries(target)
    temporary = directory / f".{target.name}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    # 0o666 & ~_NEVER, and the kernel applies the umask on top.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 & ~_NEVER)
    try:
        with os.fdopen(fd, "wb") as stream:
            torch.save(obj, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(directory)


# -- distribution ----------------------------------------------------------------------------


def _on_instance_zero(fn: Callable[[], None]) -> None:
    """Run ``fn`` on instance 0 while the others wait; a failure is raised on every instance."""
    import popdist

    popdist.execute_on_instances({0}, fn)


# -- public API ------------------------------------------------------------------------------


def _state_of(obj: Any, what: str) -> Mapping[str, Any]:
    if not hasattr(obj, "state_dict"):
        raise TypeError(f"{what} of type {type(obj).__name__} has no state_dict()")
    return obj.state_dict()


def save_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: _Stateful,
    optimizer: _Stateful | None = None,
    step: int = 0,
    dataloader: _Stateful | None = None,
    extra: Mapping[str, Any] | None = None,
) -> None:
    """Save model, optimizer, step, RNG and data-order state to ``path``, atomically.

    Call it on every instance: instance 0 writes the file, the others wait for it. ``model``
    is an ``nn.Module`` or anything with ``state_dict()`` (such as a training model);
    ``extra`` must hold plain data (it is read back weights-only).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint step={step!r} is invalid: use a non-negative integer")

    def write() -> None:
        state: dict[str, Any] = {
            "format": FORMAT,
            "step": step,
            "model": _state_of(model, "model"),
            "optimizer": _state_of(optimizer, "optimizer") if optimizer is not None else None,
            "dataloader": _state_of(dataloader, "dataloader") if dataloader is not None else None,
            "rng": rng_state(),
            "extra": dict(extra) if extra is not None else {},
        }
        atomic_save(state, path)

    _on_instance_zero(write)


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: _Stateful,
    optimizer: _Stateful | None = None,
    dataloader: _Stateful | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load ``path`` (weights-only) into the given objects; returns the whole checkpoint.

    Call it on every instance. The returned dict has ``step`` and ``extra`` (and the raw
    states). RNG states are instance 0's at save time; ``restore_rng=False`` keeps the
    current ones.
    """
    target = Path(path)
    if not target.is_file():
        raise FileNotFoundError(f"checkpoint {target} does not exist")
    try:
        state = torch.load(target, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"cannot read checkpoint {target} with weights_only=True: {exc}"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"{target} is not a popdist_torch checkpoint (expected format {FORMAT!r}); "
            "load other files with torch.load"
        )
    model.load_state_dict(state["model"])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise CheckpointError(f"checkpoint {target} holds no optimizer state")
        optimizer.load_state_dict(state["optimizer"])
    if dataloader is not None:
        if state["dataloader"] is None:
            raise CheckpointError(f"checkpoint {target} holds no DataLoader state")
        dataloader.load_state_dict(state["dataloader"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state
