"""A checkpoint that survives the host that wrote it: one verified copy per host, fenced.

:mod:`popdist_torch.checkpoint` decides *what* a checkpoint holds; this module decides
*where* its copies live and *which* one a resume takes:

- **One copy per host.** The first local instance of every host writes the checkpoint to
  the path on its own disk (``{host}`` in the path, if any, becomes poprun's name of the
  host). A copy is complete and verified by construction: it is renamed into place after it
  is flushed, and its payload carries its SHA-256 (checked on every read).
- **Nothing written twice on a shared file system.** Before the first save to a path the
  writers each drop a probe file named after it; a writer that sees the probe of a lower
  instance shares its file and leaves the writing to it. The answer is kept per path.
- **Fenced by generation.** Every copy carries the job's membership generation
  (:func:`popdist.env.generation`, raised by poprun at each relaunch on fewer hosts) and the
  directory records the newest generation that wrote there (``.<name>.generation``). A write
  from an older generation is refused, so an instance cut off from the job can never
  overwrite the survivors' checkpoint.
- **The newest copy wins a resume.** Every instance reads its host's copy (a missing or
  damaged copy counts as none); they agree on the newest ``(generation, step)``; the lowest
  instance holding it sends its bytes to every instance whose host lacks it, and those
  hosts' writers store it, so each host holds a complete copy again.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

import torch

from popdist.collectives.base import Collectives
from popdist.env import GENERATION, PopdistError, generation, read_host, read_run
from popdist_torch.errors import CheckpointError

__all__ = [
    "HOST_FIELD",
    "check_generation",
    "choose",
    "current_generation",
    "newest",
    "record_generation",
    "resolve",
    "writers",
]

#: The placeholder of a path that becomes this instance's host (one directory per host).
HOST_FIELD = "{host}"
_PROBE = ".popdist-probe-"
#: Checkpoint file → the instances that write it (computed at its first save).
_WRITERS: dict[str, frozenset[int]] = {}


def resolve(path: str | os.PathLike[str]) -> Path:
    """``path`` with ``{host}`` replaced by this instance's host (poprun's name for it)."""
    text = os.fspath(path)
    if HOST_FIELD not in text:
        return Path(text)
    return Path(text.replace(HOST_FIELD, read_host()))


def current_generation() -> int:
    """The job's membership generation, as a checkpoint error if the variable is malformed."""
    try:
        return generation()
    except PopdistError as error:
        raise CheckpointError(str(error)) from None


# -- the generation fence -------------------------------------------------------------------


def _record_path(target: Path) -> Path:
    return target.parent / f".{target.name}.generation"


def recorded_generation(target: Path) -> int:
    """The newest generation that wrote ``target``'s directory record (0: none yet)."""
    try:
        text = _record_path(target).read_text().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text.isdigit() else 0


def check_generation(target: Path, mine: int) -> None:
    """Refuse a write of generation ``mine`` where a newer generation has written."""
    recorded = recorded_generation(target)
    if mine < recorded:
        raise CheckpointError(
            f"refusing to save checkpoint {target}: this instance belongs to membership "
            f"generation {mine} ({GENERATION}) but generation {recorded} has written "
            f"there; the job was relaunched without this instance, which must stop"
        )


def record_generation(target: Path, mine: int) -> None:
    """Record generation ``mine`` for ``target`` (atomically) when it is newer."""
    if mine <= recorded_generation(target):
        return
    record = _record_path(target)
    temporary = record.parent / f"{record.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    temporary.write_text(f"{mine}\n")
    os.replace(temporary, record)


# -- who writes -------------------------------------------------------------------------------


def _flags(collectives: Collectives, value: int, name: str) -> list[int]:
    """Every instance's ``value``, in instance order."""
    gathered = collectives.allgather(torch.tensor([value], dtype=torch.int64), name=name)
    return [int(v) for v in gathered.tolist()]


def writers(target: Path, collectives: Collectives) -> frozenset[int]:
    """The instances that write ``target``: one per host, one per shared file system.

    Collective (every instance calls it with its own ``target``); the answer is kept for
    the path, so the probes run at its first save only.
    """
    key = os.fspath(target.absolute())
    if key in _WRITERS:
        return _WRITERS[key]
    run = read_run()
    first_local = run.local_instance_index == 0
    candidates = _flags(collectives, int(first_local), "popdist_torch.ckpt.candidates")
    token = collectives.broadcast_object(secrets.token_hex(8), root=0)
    probe = target.parent / f".{target.name}{_PROBE}{token}-{run.instance_index}"
    made = False
    if first_local and target.parent.is_dir():
        probe.touch()
        made = True
    collectives.barrier()
    lower = [i for i, c in enumerate(candidates) if c and i < run.instance_index]
    shares = any((target.parent / f".{target.name}{_PROBE}{token}-{i}").exists() for i in lower)
    writes = first_local and not shares
    unsure = first_local and not made  # no directory yet: ask again at the next save
    chosen = _flags(collectives, int(writes) + 2 * unsure, "popdist_torch.ckpt.writers")
    if made:
        probe.unlink(missing_ok=True)
    answer = frozenset(i for i, flag in enumerate(chosen) if flag & 1)
    if not any(flag & 2 for flag in chosen):
        _WRITERS[key] = answer
    return answer


# -- the newest copy --------------------------------------------------------------------------


def choose(keys: list[tuple[int, int] | None]) -> tuple[tuple[int, int], int] | None:
    """The newest ``(generation, step)`` among the instances' copies and the lowest instance
    holding it (``None``: no copy anywhere). A newer generation wins over a later step: a
    host cut off from the job may have gone on saving on its own disk."""
    held = [k for k in keys if k is not None]
    if not held:
        return None
    best = max(held)
    return best, keys.index(best)


def newest(
    target: Path,
    collectives: Collectives,
    read: Callable[[Path], tuple[tuple[int, int], bytes] | None],
    store: Callable[[Path, bytes], None],
) -> bytes | None:
    """The bytes of the newest complete copy any instance's host holds (``None``: no copy).

    ``read`` gives this host's copy (its key and bytes) or ``None`` when it has none or it is
    damaged; ``store`` writes bytes to a path atomically. Collective: every instance calls
    it. Hosts that lack the newest copy get it from the lowest instance that has it, and
    their writing instance stores it.
    """
    mine = read(target)
    key = mine[0] if mine else None
    has = _flags(collectives, int(key is not None), "popdist_torch.ckpt.has")
    gens = _flags(collectives, key[0] if key else -1, "popdist_torch.ckpt.generation")
    steps = _flags(collectives, key[1] if key else -1, "popdist_torch.ckpt.step")
    keys = [(g, s) if h else None for h, g, s in zip(has, gens, steps, strict=True)]
    chosen = choose(keys)
    if chosen is None:
        return None
    best, holder = chosen
    if all(k == best for k in keys):
        assert mine is not None
        return mine[1]
    run = read_run()
    data = collectives.broadcast_object(mine[1] if mine and key == best else None, root=holder)
    if not isinstance(data, bytes):
        raise CheckpointError(f"instance {holder} sent no checkpoint for {target}")
    if key != best and run.local_instance_index == 0 and target.parent.is_dir():
        store(target, data)  # this host holds a complete copy again
    return data
