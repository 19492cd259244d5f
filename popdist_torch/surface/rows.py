"""One row of the PopTorch surface table: a public PopTorch name and what it does here.

Each :class:`Row` names an owner (``poptorch`` for top-level names, ``Options``, an option
group such as ``Options.Training``, ``TensorLocationSettings`` or ``PoplarExecutor``), the
name, and its status: *supported* (does what PopTorch does), *no-op* (accepted, changes
nothing here, for the reason given) or *refused* (reachable, raises
:class:`UnsupportedOptionError` naming what to use). The constructors :func:`supported`,
:func:`no_op` and :func:`refused` keep the table in :mod:`popdist_torch.surface.names`
one line of intent per name; :func:`refusal` makes the callable a refused row stands for.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from popdist_torch.errors import OptionsError, UnsupportedOptionError

__all__ = [
    "NO_OP",
    "REFUSED",
    "SUPPORTED",
    "Row",
    "install_refusals",
    "no_op",
    "refusal",
    "refused",
    "signature",
    "supported",
    "whole_number",
]

SUPPORTED: Final = "supported"
NO_OP: Final = "no-op"
REFUSED: Final = "refused"

#: How a generated no-op setter turns its call's arguments into the value it records; its
#: signature is the setter's (``lambda show=True: bool(show)``).
Record = Callable[..., Any]


@dataclass(frozen=True)
class Row:
    """A PopTorch name, its status here and why.

    ``note``: for *supported*, what it does; for *no-op*, why it changes nothing; for
    *refused*, the reason and what to use (the error's message). ``record`` makes a no-op
    setter generated from the row (its arguments → the recorded value, kept under ``key``,
    or merged when ``key`` is ``None``); ``when`` makes a refusal conditional (the call is
    refused when it returns true, ``when_text`` says when on the page).
    """

    owner: str
    name: str
    status: str
    note: str = ""
    section: str = ""
    record: Record | None = None
    key: str | None = ""
    when: Callable[..., bool] | None = None
    when_text: str = ""

    @property
    def qualified(self) -> str:
        """The name as the page and the messages write it: ``Options.Training.x``."""
        return f"{self.owner}.{self.name}"

    @property
    def path(self) -> str:
        """The attribute path from the owner's root object: ``Training.x`` for ``Options``."""
        group = self.owner.partition(".")[2]
        return f"{group}.{self.name}" if group else self.name

    @property
    def generated(self) -> bool:
        """Whether the attribute is made from this row (a refusal, a recorded no-op setter)."""
        return self.status == REFUSED or (self.status == NO_OP and self.record is not None)

    @property
    def record_key(self) -> str | None:
        """Where a generated no-op keeps its value (``None``: the value is a mapping to merge)."""
        return self.name if self.key == "" else self.key

    def message(self) -> str:
        """What a refused call raises."""
        return f"{self.qualified} is not supported: {self.note}"


def supported(owner: str, name: str, note: str = "", section: str = "") -> Row:
    """A name that does what PopTorch's does (on CPU or GPU instead of IPUs)."""
    return Row(owner, name, SUPPORTED, note, section)


def no_op(
    owner: str,
    name: str,
    note: str,
    record: Record | None = None,
    *,
    key: str | None = "",
    section: str = "",
) -> Row:
    """A name accepted so the script runs; ``record`` generates the setter that keeps its value."""
    return Row(owner, name, NO_OP, note, section, record, key)


def refused(
    owner: str,
    name: str,
    note: str,
    *,
    when: Callable[..., bool] | None = None,
    when_text: str = "",
    section: str = "",
) -> Row:
    """A name that raises :class:`UnsupportedOptionError` with ``note`` (when ``when`` holds)."""
    return Row(owner, name, REFUSED, note, section, when=when, when_text=when_text)


def refusal(row: Row, *, method: bool = False) -> Callable[..., Any]:
    """The callable a refused row stands for: it raises, naming why and what to use.

    ``method``: a method (the first argument is the object). A conditional refusal returns
    the object (or ``None`` for a function) when its condition does not hold.
    """
    message, when = row.message(), row.when

    def refuse(*args: Any, **kwargs: Any) -> Any:
        call_args = args[1:] if method else args
        if when is None or when(*call_args, **kwargs):
            raise UnsupportedOptionError(message)
        return args[0] if method else None

    refuse.__name__ = refuse.__qualname__ = row.name
    refuse.__doc__ = f"Not supported here: {row.note}"
    if when is not None:
        refuse.__signature__ = signature(when, method=method)  # type: ignore[attr-defined]
    return refuse


def install_refusals(cls: type, rows: Iterable[Row]) -> None:
    """Give ``cls`` a refusing method for each refused row (none of them written by hand)."""
    for row in rows:
        if row.status != REFUSED:
            continue
        if row.name in cls.__dict__:
            raise TypeError(f"{cls.__name__}.{row.name} is written by hand but refused by its row")
        method = refusal(row, method=True)
        method.__qualname__ = f"{cls.__name__}.{row.name}"
        setattr(cls, row.name, method)


def signature(template: Callable[..., Any], *, method: bool) -> inspect.Signature:
    """``template``'s signature (a row's ``record`` or ``when``), with ``self`` for a method."""
    found = inspect.signature(template)
    if not method:
        return found
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return found.replace(parameters=[self, *found.parameters.values()])


def whole_number(name: str, value: object, *, minimum: int = 1) -> int:
    """``value`` as an integer of at least ``minimum``, or an :class:`OptionsError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionsError(f"{name}({value!r}): expected an integer >= {minimum}")
    return int(value)
