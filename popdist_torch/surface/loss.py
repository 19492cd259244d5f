"""The loss PopTorch would take: one rule, shared by the plain executor and the pipeline.

PopTorch trains on the tensor ``poptorch.identity_loss`` returns, wherever the model's
output holds it and whatever shape its reduction leaves. Here, while a training forward runs,
the executor (and each pipeline stage) watches what ``identity_loss`` marks
(:func:`watching_losses`, :func:`mark_loss`), then finds the loss in the output:

1. the one leaf ``identity_loss`` marked, anywhere in the output (tuples, lists, dicts and
   ``ModelOutput``s, nested), any shape (two different marked leaves: refused, as PopTorch);
2. else the output itself; a mapping's ``"loss"``; a tuple's or list's last element if it is
   loss-like (one element per micro-batch, a scalar or shaped ``(1,)``, needing gradients),
   else its first if that one is, else its last.

The loss must need gradients, and an unmarked one must have one element per micro-batch.
Backward seeds every element of the loss with the micro-batch's scale (:func:`backward_loss`):
for a loss of several elements (``identity_loss(x, reduction="none")``) that is the gradient
of their sum, as PopTorch's. docs/executor.md states the rule.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import torch

from popdist_torch.errors import ExecutorError

__all__ = [
    "Path",
    "backward_loss",
    "find_loss",
    "leaf_at",
    "leaves",
    "loss_at",
    "loss_like",
    "loss_path",
    "mark_loss",
    "marked_path",
    "unmarked_path",
    "watching_losses",
]

#: Where a leaf is in a model's output: the keys and indices from the output down to it
#: (``()``: the output itself).
Path = tuple[int | str, ...]

_watch = threading.local()
_T = TypeVar("_T")


def mark_loss(value: _T) -> _T:
    """What ``identity_loss`` returns, marked as the loss of the forward being watched."""
    marks = getattr(_watch, "marks", None)
    if marks is not None:
        marks.append(value)
    return value


class watching_losses:  # lower case: read as ``with watching_losses() as marks``
    """Collect, in this thread, what ``identity_loss`` marks while one forward runs.

    A class, not a generator context: it is entered for every training forward."""

    __slots__ = ("_marks", "_outer")

    def __enter__(self) -> list[Any]:
        self._outer = getattr(_watch, "marks", None)
        self._marks: list[Any] = []
        _watch.marks = self._marks
        return self._marks

    def __exit__(self, *exc: object) -> None:
        _watch.marks = self._outer


def leaves(output: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every leaf of ``output`` (tuples, lists, mappings such as a ``ModelOutput``) and its path."""
    if isinstance(output, Mapping):
        for key, value in output.items():
            yield from leaves(value, (*path, key))
    elif isinstance(output, (tuple, list)):
        for i, value in enumerate(output):
            yield from leaves(value, (*path, i))
    else:
        yield path, output


def leaf_at(output: Any, path: Path) -> Any:
    for key in path:
        output = output[key]
    return output


def marked_path(output: Any, marked: Callable[[Any], bool], error: type[Exception]) -> Path | None:
    """Rule 1: where the leaf ``identity_loss`` marked is, wherever the output holds it.

    PopTorch takes the tensor ``identity_loss`` returned as the loss whatever its place and its
    shape; as PopTorch, two different marked tensors are refused (there is one final loss).
    """
    found: list[tuple[Path, Any]] = []
    for path, leaf in leaves(output):
        if marked(leaf) and not any(leaf is other for _, other in found):
            found.append((path, leaf))
    if len(found) > 1:
        raise error(
            f"the model's output holds {len(found)} different losses marked by identity_loss "
            f"(at {', '.join(_where(p) for p, _ in found)}): there is one final loss; sum the "
            "losses and mark the sum: identity_loss(l1 + l2, reduction='none')"
        )
    return found[0][0] if found else None


def unmarked_path(output: Any, loss_like: Callable[[Any], bool], error: type[Exception]) -> Path:
    """Rule 2, with no marked leaf: the output itself; in a mapping (a Hugging Face
    ``ModelOutput``) the key ``"loss"``; in a tuple or list the last element if it is
    loss-like (one element per micro-batch, needing gradients), else the first if that one is,
    else the last (which the checks then reject with a message)."""
    if isinstance(output, Mapping):
        if "loss" not in output:
            raise error(
                f"a training model's forward returned a dict with keys {list(output)} and no "
                "'loss': return the loss under 'loss' (Hugging Face models: pass labels=...)"
            )
        return ("loss",)
    if not isinstance(output, (tuple, list)) or not output:
        return ()
    last = len(output) - 1
    if loss_like(output[last]) or not loss_like(output[0]):
        return (last,)
    return (0,)


def loss_path(
    output: Any,
    marks: Sequence[Any] = (),
    *,
    replicas: bool = False,
    error: type[Exception] = ExecutorError,
) -> tuple[Path, bool]:
    """Where the loss is in ``output``, and whether ``identity_loss`` marked it: rule 1, else
    rule 2 (docs/executor.md). ``replicas``: the output of the replicas' ``vmap``, whose leaves
    have a leading replica dimension."""
    if marks:  # nothing marked (no identity_loss ran): no walk
        found = marked_path(output, lambda leaf: any(leaf is m for m in marks), error)
        if found is not None:
            return found, True
    return unmarked_path(output, lambda leaf: loss_like(leaf, replicas=replicas), error), False


def loss_like(value: Any, *, replicas: bool = False) -> bool:
    """One element per micro-batch (a scalar, or shaped ``(1,)``), needing gradients."""
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        return False
    if replicas:
        return value.dim() >= 1 and value.numel() == value.shape[0]
    return value.numel() == 1


def loss_at(
    output: Any,
    path: Path,
    marked: bool,
    *,
    replicas: bool = False,
    error: type[Exception] = ExecutorError,
) -> torch.Tensor:
    """The loss at ``path``, checked: a tensor that needs gradients, and unless
    ``identity_loss`` marked it (any shape), one element per micro-batch."""
    loss = leaf_at(output, path)
    if not isinstance(loss, torch.Tensor):
        raise error(
            f"a training model's forward must return its loss as a tensor: alone, marked by "
            f"identity_loss anywhere in its output, a tuple whose first or last element is the "
            f"loss, or a dict with the key 'loss'; got {type(loss).__name__} at {_where(path)}"
        )
    one = loss.numel() == loss.shape[0] if replicas and loss.dim() else loss.numel() == 1
    if not marked and not one:
        shape = tuple(loss.shape[1:] if replicas else loss.shape)
        raise error(
            f"the loss must be a scalar per micro-batch, got shape {shape} at {_where(path)}: "
            "reduce it (loss.mean(), loss.sum()) or mark it with identity_loss(x, "
            "reduction='mean' or 'none')"
        )
    if not loss.requires_grad:
        raise error(
            f"the loss (at {_where(path)}) does not depend on any trainable parameter: check "
            "that forward() uses the module's parameters and that they have "
            "requires_grad=True, or mark the loss with identity_loss"
        )
    return loss


def find_loss(
    output: Any, marks: Sequence[Any] = (), *, error: type[Exception] = ExecutorError
) -> torch.Tensor:
    """The loss of one micro-batch's ``output`` (:func:`loss_path`, then :func:`loss_at`)."""
    path, marked = loss_path(output, marks, error=error)
    return loss_at(output, path, marked, error=error)


def backward_loss(loss: torch.Tensor, scale: float) -> None:
    """``scale × loss`` back-propagated; a loss of several elements (``identity_loss(x,
    reduction="none")``) as PopTorch does: every element's gradient seeded with ``scale``,
    the gradient of ``scale × loss.sum()``."""
    if loss.dim() == 0:
        # A scale of 1 (one replica, no accumulation, no loss scaling): no extra op
        (loss if scale == 1.0 else loss * scale).backward()  # type: ignore[no-untyped-call]
    else:
        loss.backward(torch.full_like(loss, scale))  # type: ignore[no-untyped-call]


def _where(path: Path) -> str:
    return "the output" if not path else "output" + "".join(f"[{k!r}]" for k in path)
