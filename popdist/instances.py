"""``execute_on_instances``: run a function on some instances while the others wait.

The usual use is I/O that one instance should do for everybody, such as
``popdist.execute_on_instances({0}, save_checkpoint, model)``. The listed instances call
the function; then every instance, listed or not, takes part in one small collective (an
allgather of a success flag) before returning. So the instances leave together, the next
collective every instance submits is the same one, and a failure on one instance is
reported on all of them instead of leaving the others waiting.
"""

from __future__ import annotations

from popdist.env import PopdistError, read_run

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, TypeVar

    T = TypeVar("T")

__all__ = ["execute_on_instances"]


def _chosen(instances: Iterable[int], num_instances: int) -> frozenset[int]:
    if isinstance(instances, int | str | bytes):
        raise PopdistError(
            f"instances={instances!r}: expected a set of instance indices, e.g. {{0}}"
        )
    chosen = frozenset(instances)
    bad = sorted(
        (
            i
            for i in chosen
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < num_instances
        ),
        key=repr,
    )
    if bad:
        raise PopdistError(
            f"instances={sorted(chosen, key=repr)!r}: {bad[0]!r} is not an instance index in "
            f"[0, {num_instances}) (getNumInstances()={num_instances})"
        )
    if not chosen:
        raise PopdistError("instances=set(): name at least one instance, e.g. {0}")
    return chosen


def execute_on_instances(
    instances: Iterable[int], fn: Callable[..., T], *args: Any, **kwargs: Any
) -> T | None:
    """Call ``fn(*args, **kwargs)`` on the listed instances only; every instance waits.

    Returns ``fn``'s result on the instances where it ran and ``None`` on the others.
    Every instance must call this with the same ``instances``. In a run of several
    instances it starts the backend (:func:`popdist.init`) if needed; a run of one uses the
    local backend (:func:`popdist.collectives.for_run`) and starts nothing. ``fn`` must not
    itself submit collectives over all instances (the others are not there to match them).
    If ``fn`` raises on some instance, that instance re-raises it and every other one
    raises :class:`PopdistError` naming the failed instances, so no instance is left
    waiting for a partner that has gone.
    """
    run = read_run()
    chosen = _chosen(instances, run.num_instances)
    from popdist.collectives import for_run

    collectives = for_run()  # one instance: the local backend, nothing started
    result: T | None = None
    error: Exception | None = None
    if run.instance_index in chosen:
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # reported to every instance below, then re-raised
            error = exc
    import torch

    flags = collectives.allgather(
        torch.tensor([1 if error is not None else 0], dtype=torch.int32),
        name="popdist.execute_on_instances",
    )
    failed = [i for i, flag in enumerate(flags.tolist()) if flag]
    if error is not None:
        raise error
    if failed:
        name = getattr(fn, "__qualname__", repr(fn))
        raise PopdistError(
            f"execute_on_instances: {name} failed on instance(s) {failed}; see their error "
            f"output for the cause"
        )
    return result
