"""Host files (pure): poprun's own format and Open MPI's, one grammar.

A line names one host, or a range of them (``node[0-3]``, poprun's own), optionally with
Open MPI's slot counts: ``node1 slots=2 max_slots=4`` (also ``slot``, ``cpu``, ``cpus``,
``count``; ``max-slots``, ``maxslots``), or the ``node1:2`` of Intel MPI and MPICH host
files. ``#`` starts a comment. This is the file every mpirun, horovodrun and DeepSpeed user
and every Kubernetes ``MPIJob`` already has, and ``$PBS_NODEFILE`` and LSF's
``$LSB_DJOB_HOSTFILE`` are the same grammar with one line per slot: a host named on several
lines has their slots added up, in the order hosts first appear (as Open MPI reads them).

A file that gives no slot count and names no host twice is a plain host list (poprun's
format before Open MPI's): its hosts share the instances evenly. Otherwise every line counts
its slots (``default_slots`` where it gives none: ``orte_set_default_slots``, else 1) and
the instances fill the hosts in order up to them, as mpirun's ``--map-by slot``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from poprun.errors import PoprunError

#: What turns one name or range into host names (``poprun.plan.hosts``' ``-H`` grammar),
#: given the option or variable and ``file:line`` for its errors.
Expand = Callable[[str, str, str], list[str]]

#: Open MPI's words for a line's slots and its hard limit.
SLOT_KEYS = frozenset({"slots", "slot", "cpu", "cpus", "count"})
MAX_KEYS = frozenset({"max_slots", "max-slots", "maxslots"})
_COLON = re.compile(r"^([^:\s]+):(\d+)$")
_FIX = (
    "write one host a line: NAME, NAME slots=N [max_slots=M], NAME:N or a range "
    "prefix[0-3]; '#' starts a comment"
)


class FileHosts(NamedTuple):
    """What a host file says: its hosts in order, their slots, and whether it gave any."""

    hosts: tuple[str, ...]
    slots: tuple[int, ...]
    #: Their hard limits (0: none), for ``--oversubscribe``.
    max_slots: tuple[int, ...]
    #: Whether the file counts slots (``slots=``, ``:N``, or a host on several lines).
    slotted: bool

    @property
    def total(self) -> int:
        return sum(self.slots)


def parse(
    text: str,
    source: str,
    path: str,
    *,
    default_slots: int | None = None,
    expand: Expand | None = None,
) -> FileHosts:
    """Read a host file's ``text``; errors name ``source`` (the option or variable), the file
    and the line. ``expand`` turns a range into names (poprun's ``-H`` grammar)."""
    given: dict[str, int] = {}  # slots the lines gave, per host, in first-seen order
    bare: dict[str, int] = {}  # lines that gave none
    limits: dict[str, int] = {}
    counted = default_slots is not None
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        name, count, limit = _line(words, source, where, line.strip())
        counted = counted or count is not None or limit is not None
        for host in expand(name, source, where) if expand else [name]:
            counted = counted or host in given
            given[host] = given.get(host, 0) + (count or 0)
            bare[host] = bare.get(host, 0) + (count is None)
            if limit is not None:
                limits[host] = limits.get(host, 0) + limit
    if not given:
        raise PoprunError(source, path, "lists no hosts", _FIX)
    fill = 1 if default_slots is None else default_slots
    hosts = tuple(given)
    return FileHosts(
        hosts,
        tuple(given[h] + bare[h] * fill for h in hosts),
        tuple(limits.get(h, 0) for h in hosts),
        counted,
    )


def _line(
    words: list[str], source: str, where: str, shown: str
) -> tuple[str, int | None, int | None]:
    """(name, slots or None, max_slots or None) of one line's words."""
    name, count, limit = words[0], None, None
    colon = _COLON.match(name)
    if colon is not None:
        name, count = colon.group(1), _positive(colon.group(2), "slots", source, where, shown)
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq:
            raise PoprunError(
                source, where, f"{shown!r} is in neither poprun's nor Open MPI's format", _FIX
            )
        if key in SLOT_KEYS:
            count = _positive(value, key, source, where, shown)
        elif key in MAX_KEYS:
            limit = _positive(value, key, source, where, shown)
        else:
            raise PoprunError(
                source, where, f"{shown!r}: {key}= is not a host-file setting poprun knows", _FIX
            )
    return name, count, limit


def _positive(value: str, key: str, source: str, where: str, shown: str) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise PoprunError(
            source,
            where,
            f"{shown!r}: {key} {value!r} is not a positive whole number",
            f"write {key}=N with N at least 1",
        )
    return int(value)
