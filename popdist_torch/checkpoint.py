"""Atomic, weights-only checkpoints of a distributed run.

:func:`save_checkpoint` writes one copy per host (its first local instance writes it, once
per shared file system, fenced by the job's membership generation:
:mod:`popdist_torch.host_copies`); the other instances wait until the copies are complete
(and learn whether the save worked). :func:`resume_checkpoint` takes the newest complete
copy any host holds. The file is written next to its final
name, flushed, fsync'ed and renamed over it, then the directory is fsync'ed: a crash or
SIGKILL at any moment leaves either the previous checkpoint or the new one, never a torn
file. New files honour the umask and are never world-writable.

:func:`load_checkpoint` runs on every instance and reads with ``torch.load(...,
weights_only=True)``, so a checkpoint cannot execute code. Everything saved is therefore
plain data: tensors, numbers, strings, lists, tuples and dicts; random-number-generator
states are stored as tensors and tuples. ``extra`` may also hold NumPy arrays and scalars,
paths, ``argparse.Namespace``, sets and ``datetime`` values: they are stored as tagged
plain data and rebuilt on load; anything else that could not be loaded back is refused
at save, naming where it is.

The file holds the serialized state as one byte payload with its SHA-256: a flipped bit
or zeroed bytes are found on load (:class:`CheckpointError`), never loaded as wrong
weights. Files of the first format (no checksum) still load.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import os
import random
import secrets
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import Any, Protocol

import torch

from popdist.collectives.base import Collectives
from popdist_torch import host_copies
from popdist_torch.errors import CheckpointError

__all__ = [
    "CheckpointError",
    "load_checkpoint",
    "read_checkpoint",
    "resume_checkpoint",
    "save_checkpoint",
    "save_on_notice",
]

FORMAT = "popdist_torch.checkpoint/1"  # the state itself (the payload)
#: The file: the payload's bytes and their SHA-256.
FILE_FORMAT = "popdist_torch.checkpoint/2"
#: The key that marks a value of ``extra`` stored in tagged form.
_TAG = "__popdist_torch_type__"
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
    if target.is_dir():
        raise CheckpointError(
            f"cannot save checkpoint {target}: it is a directory; give a file path, "
            f"such as {target / 'checkpoint.pt'}"
        )
    _remove_stale_temporaries(target)
    temporary = directory / f".{target.name}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        # 0o666 & ~_NEVER, and the kernel applies the umask on top.
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 & ~_NEVER)
        try:
            with os.fdopen(fd, "wb") as stream:
                if isinstance(obj, _Raw):
                    stream.write(obj.data)
                else:
                    torch.save(obj, stream)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        _fsync_directory(directory)
    except OSError as error:  # a full disk, a quota, a read-only file system
        kept = "the previous checkpoint is intact" if target.exists() else "nothing was written"
        raise CheckpointError(
            f"cannot save checkpoint {target}: {error.strerror or error}; {kept}; "
            "free space or choose another directory"
        ) from error


# -- extra: more than plain data, stored as plain data ------------------------------------


def _encode(value: Any, where: str) -> Any:
    """``value`` with NumPy values, paths, namespaces, sets and dates in tagged plain form."""
    numpy = _numpy()  # first: numpy.float64 is also a float
    if numpy is not None and isinstance(value, (numpy.ndarray, numpy.generic)):
        array = numpy.asarray(value)
        if array.dtype.hasobject:
            raise TypeError(
                f"save_checkpoint {where} is a NumPy array of Python objects, which cannot "
                "be loaded back safely: convert it to a numeric array or to a list"
            )
        raw = bytearray(numpy.ascontiguousarray(array).tobytes())
        return {
            _TAG: "ndarray" if isinstance(value, numpy.ndarray) else "numpy_scalar",
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            "data": torch.frombuffer(raw, dtype=torch.uint8)
            if raw
            else torch.empty(0, dtype=torch.uint8),
        }
    if value is None or isinstance(value, (bool, int, float, str, bytes, torch.Tensor)):
        return value
    if isinstance(value, Mapping):
        if _TAG in value:
            raise TypeError(f"save_checkpoint {where} uses the reserved key {_TAG!r}")
        return {key: _encode(item, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_encode(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, (set, frozenset)):
        items = [_encode(item, f"{where} item") for item in value]
        return {_TAG: type(value).__name__, "items": items}
    if isinstance(value, PurePath):
        return {_TAG: "path", "value": str(value)}
    if isinstance(value, argparse.Namespace):
        return {_TAG: "namespace", "value": _encode(vars(value), where)}
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return {_TAG: type(value).__name__, "value": value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {_TAG: "timedelta", "value": [value.days, value.seconds, value.microseconds]}
    return value  # left to the check that it loads back (see _check_extra)


def _decode(value: Any) -> Any:
    """The inverse of :func:`_encode`."""
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_decode(item) for item in value)
    if not isinstance(value, dict):
        return value
    kind = value.get(_TAG)
    if kind is None:
        return {key: _decode(item) for key, item in value.items()}
    if kind in ("set", "frozenset"):
        items = [_decode(item) for item in value["items"]]
        return set(items) if kind == "set" else frozenset(items)
    if kind == "path":
        return Path(value["value"])
    if kind == "namespace":
        return argparse.Namespace(**_decode(value["value"]))
    if kind in ("datetime", "date", "time"):
        return getattr(datetime, kind).fromisoformat(value["value"])
    if kind == "timedelta":
        days, seconds, micro = value["value"]
        return datetime.timedelta(days=days, seconds=seconds, microseconds=micro)
    if kind in ("ndarray", "numpy_scalar"):
        import numpy

        array = numpy.frombuffer(value["data"].numpy().tobytes(), dtype=numpy.dtype(value["dtype"]))
        array = array.reshape(value["shape"]).copy()
        return array if kind == "ndarray" else array[()]
    raise CheckpointError(f"checkpoint extra holds an unknown stored type {kind!r}")


def _check_extra(extra: dict[str, Any]) -> None:
    """Refuse, at save, an ``extra`` that ``torch.load(weights_only=True)`` could not read."""
    buffer = io.BytesIO()
    torch.save(extra, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception as error:
        lines = [line.strip() for line in str(error).splitlines() if "Unsupported global" in line]
        why = lines[0].split(" was not ")[0] if lines else type(error).__name__
        raise TypeError(
            "save_checkpoint extra holds a value that could not be loaded back weights-only "
            f"({why}): store plain data (numbers, "
            "strings, lists, dicts, tensors, NumPy arrays, paths, dates) instead"
        ) from None


# -- the file: payload and checksum --------------------------------------------------------


def _pack(state: dict[str, Any]) -> dict[str, Any]:
    """The file's content: ``state`` serialized, as bytes with their SHA-256."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getbuffer()
    return {
        "format": FILE_FORMAT,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "payload": torch.frombuffer(bytearray(payload), dtype=torch.uint8),
    }


def _unpack(target: Path, packed: dict[str, Any]) -> Any:
    """The state inside a file of :data:`FILE_FORMAT`, after checking its SHA-256."""
    payload = packed.get("payload")
    digest = packed.get("sha256")
    if not isinstance(payload, torch.Tensor) or not isinstance(digest, str):
        raise CheckpointError(f"checkpoint {target} is damaged: its payload or checksum is missing")
    data = payload.numpy().tobytes()
    if hashlib.sha256(data).hexdigest() != digest:
        raise CheckpointError(
            f"checkpoint {target} is damaged: its payload does not match its SHA-256 "
            "(bit flips or overwritten bytes on disk); load an earlier checkpoint"
        )
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot read checkpoint {target}'s payload: {exc}") from exc


# -- distribution ----------------------------------------------------------------------------


def _collectives() -> Collectives:
    """The run's collectives (one instance: the local backend, nothing started)."""
    from popdist.collectives import for_run

    return for_run()


def _on_writers(target: Path, fn: Callable[[], None]) -> None:
    """Run ``fn`` on the instances that write ``target`` (one per host); the others wait."""
    import popdist

    popdist.execute_on_instances(host_copies.writers(target, _collectives()), fn)


def _instance_zero_rng() -> dict[str, Any]:
    """Instance 0's generators, on every instance (every host's copy holds the same)."""
    collectives = _collectives()
    if collectives.size() == 1:
        return rng_state()
    state: dict[str, Any] = collectives.broadcast_object(rng_state(), root=0)
    return state


def _write_fenced(target: Path, obj: Any, mine: int) -> None:
    """``obj`` to ``target`` atomically, unless a newer generation has written there."""
    host_copies.check_generation(target, mine)
    if target.parent.is_dir():
        host_copies.record_generation(target, mine)
    atomic_save(obj, target)


def _store_bytes(target: Path, data: bytes) -> None:
    """A copy received from another host, stored as this host's (same fence, same atomicity)."""
    _write_fenced(target, _Raw(data), host_copies.current_generation())


class _Raw:
    """Bytes that :func:`atomic_save` writes as they are (a copy of a checkpoint file)."""

    def __init__(self, data: bytes) -> None:
        self.data = data


# -- public API ------------------------------------------------------------------------------


def _topology() -> dict[str, int]:
    """The run that saved the checkpoint (instances and replicas), for the record."""
    import popdist

    return {
        "instances": popdist.getNumInstances(),
        "replicas": popdist.getNumTotalReplicas(),
        "local_replicas": popdist.getNumLocalReplicas(),
    }


def _state_of(obj: Any, what: str) -> Mapping[str, Any]:
    if not hasattr(obj, "state_dict"):
        raise TypeError(f"{what} of type {type(obj).__name__} has no state_dict()")
    state: Mapping[str, Any] = obj.state_dict()
    return state


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

    Call it on every instance: the first local instance of each host writes its host's copy
    (once per shared file system), the others wait for them. ``{host}`` in ``path`` becomes
    the instance's host. ``model`` is an ``nn.Module`` or anything with ``state_dict()``
    (such as a training model); ``extra`` holds plain data, NumPy values, paths, namespaces,
    sets or dates (it is read back weights-only); anything else raises ``TypeError`` here,
    before anything is written. A save from an older membership generation than the
    directory records raises :class:`CheckpointError` and writes nothing.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"save_checkpoint step={step!r} is invalid: use a non-negative integer")
    stored_extra = _encode(dict(extra), "extra") if extra is not None else {}
    _check_extra(stored_extra)  # on every instance: all of them raise the same error
    target, mine = host_copies.resolve(path), host_copies.current_generation()
    rng = _instance_zero_rng()

    def write() -> None:
        state: dict[str, Any] = {
            "format": FORMAT,
            "step": step,
            "generation": mine,
            "model": _state_of(model, "model"),
            "optimizer": _state_of(optimizer, "optimizer") if optimizer is not None else None,
            "dataloader": _state_of(dataloader, "dataloader") if dataloader is not None else None,
            "rng": rng,
            "extra": stored_extra,
            "topology": _topology(),
        }
        _write_fenced(target, _pack(state), mine)

    if optimizer is not None:  # a sharded optimizer state, whole on every instance too
        from popdist_torch.optim.sharded import gather_state

        gather_state(optimizer)
    _on_writers(target, write)


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: _Stateful,
    optimizer: _Stateful | None = None,
    dataloader: _Stateful | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load ``path`` (weights-only) into the given objects; returns the whole checkpoint.

    Call it on every instance. The returned dict has ``step``, ``extra``, ``topology`` (the
    saving run's instances and replicas) and the raw states. RNG states are instance 0's
    at save time; ``restore_rng=False`` keeps the current ones. A damaged file (checksum
    mismatch) or a DataLoader state that cannot resume exactly on this topology raises
    :class:`CheckpointError`.
    """
    target = host_copies.resolve(path)
    return _apply(target, read_checkpoint(target), model, optimizer, dataloader, restore_rng)


def _apply(
    target: Path,
    state: dict[str, Any],
    model: _Stateful,
    optimizer: _Stateful | None,
    dataloader: _Stateful | None,
    restore_rng: bool,
) -> dict[str, Any]:
    """Load ``state`` (read from ``target``) into the given objects; returns it."""
    if dataloader is not None:  # first: a refusal leaves every object untouched
        if state["dataloader"] is None:
            raise CheckpointError(f"checkpoint {target} holds no DataLoader state")
        try:
            dataloader.load_state_dict(state["dataloader"])
        except ValueError as error:  # saved on another topology: the data order would differ
            raise CheckpointError(f"cannot resume from checkpoint {target}: {error}") from None
    model.load_state_dict(state["model"])
    if optimizer is not None:
        if state["optimizer"] is None:
            raise CheckpointError(f"checkpoint {target} holds no optimizer state")
        optimizer.load_state_dict(state["optimizer"])
    if restore_rng:
        set_rng_state(state["rng"])
    return state


def resume_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: _Stateful,
    optimizer: _Stateful | None = None,
    dataloader: _Stateful | None = None,
) -> int:
    """The step to start from: ``path``'s if it exists (loaded as :func:`load_checkpoint`), else 0.

    Call it on every instance at start-up, then save with :func:`save_checkpoint` as you go:
    the same script then starts fresh the first time and resumes exactly after a restart
    (``poprun --max-restarts N`` relaunches the job after an instance failure; saves are
    atomic, so the file is always the last complete one). The instances agree on the newest
    complete copy any host holds (the highest membership generation, then the highest
    step); hosts that lack it receive it from a host that has it, and store it.
    """
    target = host_copies.resolve(path)
    parsed: dict[bytes, dict[str, Any]] = {}

    def read(where: Path) -> tuple[tuple[int, int], bytes] | None:
        if not where.is_file():
            return None
        data = where.read_bytes()
        try:
            state = _parse(where, io.BytesIO(data))
        except CheckpointError as error:  # another host may hold a good copy
            warnings.warn(f"{error}; looking for another host's copy", stacklevel=3)
            return None
        parsed[data] = state
        return (int(state.get("generation", 0)), int(state["step"])), data

    data = host_copies.newest(target, _collectives(), read, _store_bytes)
    if data is None:
        return 0
    state = parsed.get(data) or _parse(target, io.BytesIO(data))
    _apply(target, state, model, optimizer, dataloader, restore_rng=True)
    return int(state["step"])


def save_on_notice(
    path: str | os.PathLike[str],
    *,
    model: _Stateful,
    optimizer: _Stateful | None = None,
    step: int = 0,
    dataloader: _Stateful | None = None,
    extra: Mapping[str, Any] | None = None,
) -> bool:
    """Save a checkpoint if the job should stop now (poprun's time-limit notice); whether it did.

    Call it on every instance at the same point of each step, with what
    :func:`save_checkpoint` takes; when it returns True, stop training (poprun then ends
    the job with exit code 75 and, with ``--requeue-on-timeout``, requeues it; the next
    run's :func:`resume_checkpoint` continues from here). The question is
    :func:`popdist.should_stop`: the same answer on every instance at the same step.
    """
    import popdist

    if not popdist.should_stop():
        return False
    save_checkpoint(
        path, model=model, optimizer=optimizer, step=step, dataloader=dataloader, extra=extra
    )
    return True


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checkpoint at ``path`` as a dict, checked and decoded, without loading it anywhere.

    For inspection (``step``, ``extra``, ``topology``, the raw states); read weights-only,
    the payload's SHA-256 verified.
    """
    target = host_copies.resolve(path)
    if target.is_dir():
        raise CheckpointError(
            f"checkpoint {target} is a directory: give the checkpoint file's path"
        )
    if not target.is_file():
        raise FileNotFoundError(f"checkpoint {target} does not exist")
    return _parse(target, target)


def _parse(target: Path, source: Path | io.BytesIO) -> dict[str, Any]:
    """The checkpoint in ``source`` (the file ``target``, or its bytes), checked and decoded."""
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(
            f"cannot read checkpoint {target} with weights_only=True: {exc}"
        ) from exc
    if isinstance(state, dict) and state.get("format") == FILE_FORMAT:
        state = _unpack(target, state)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"{target} is not a popdist_torch checkpoint (expected format {FILE_FORMAT!r}); "
            "load other files with torch.load"
        )
    state["extra"] = _decode(state.get("extra", {}))
    state.setdefault("generation", 0)  # saved before checkpoints carried it
    return state
