"""How poprun's reports speak of many instances at once (pure): index ranges, host ranges,
the spread of a figure, counts.

A report that writes a line per instance cannot be read at 4,096 of them. Up to
:data:`THRESHOLD` instances a report lists each (as it always has); past it, the failure
report, the straggler table, ``--print-topology``, the summary signal, the hang report and the
status page name :data:`TOP` instances and sum up the rest: ``0-4095``, ``node[0-511]``,
``10.1-10.6 ms (median 10.3)``, ``4,088 more``. Whatever a report names as the cause is still
named exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

#: A report lists each instance up to this many, and summarises past it.
THRESHOLD = 16
#: ... naming this many of them (the slowest, the first, the ones that matter).
TOP = 8
#: A host name that ends in a number: (prefix, digits, suffix).
_NUMBERED = r"^(.*?)(\d+)(\D*)$"


def count(n: int, word: str) -> str:
    """``1 instance``, ``4,096 instances`` (``word`` in the singular, plural with an s)."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def ranges(indices: Iterable[int], most: int = TOP) -> str:
    """``0-3, 5, 7-9``: the sorted indices as runs of consecutive numbers; past ``most``
    runs, the first ``most`` and how many more."""
    runs: list[list[int]] = []
    for i in sorted(set(indices)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:most]]
    if len(runs) > most:
        shown.append(f"… ({len(runs) - most:,} more runs)")
    return ", ".join(shown) or "none"


class _Run:
    """Host names ``prefix<first..last>suffix`` (``width``: zero-padded to it), or one name
    (``first`` < 0)."""

    __slots__ = ("first", "last", "prefix", "suffix", "width")

    def __init__(self, prefix: str, suffix: str = "", width: int = 0, number: int = -1) -> None:
        self.prefix, self.suffix, self.width = prefix, suffix, width
        self.first = self.last = number

    def takes(self, prefix: str, suffix: str, digits: str) -> bool:
        """Whether the name ``prefix digits suffix`` continues this run (and now does)."""
        width = len(digits) if len(digits) > 1 and digits[0] == "0" else 0  # zero-padded
        fits = self.width == width or (self.width > 0 and len(digits) == self.width)
        if self.first < 0 or (self.prefix, self.suffix) != (prefix, suffix) or not fits:
            return False
        if int(digits) != self.last + 1:
            return False
        self.last += 1
        return True

    def __len__(self) -> int:
        return 1 if self.first < 0 else self.last - self.first + 1

    def __str__(self) -> str:
        if self.first < 0:
            return self.prefix
        a, b = str(self.first).zfill(self.width), str(self.last).zfill(self.width)
        middle = a if self.first == self.last else f"[{a}-{b}]"
        return f"{self.prefix}{middle}{self.suffix}"


def hosts(names: Iterable[str], most: int = TOP) -> str:
    """``node[0-511]``, ``a, gpu[01-04]``: host names in order of first appearance, a run of
    numbered ones (one prefix, one width) as one range; past ``most`` runs, the first
    ``most`` and how many more hosts."""
    runs: list[_Run] = []
    for name in dict.fromkeys(names):
        match = re.match(_NUMBERED, name)  # (re caches the compiled pattern)
        if match is None:
            runs.append(_Run(name))
            continue
        prefix, digits, suffix = match.groups()
        if not (runs and runs[-1].takes(prefix, suffix, digits)):
            width = len(digits) if len(digits) > 1 and digits[0] == "0" else 0
            runs.append(_Run(prefix, suffix, width, int(digits)))
    shown = [str(run) for run in runs[:most]]
    if len(runs) > most:
        shown.append(f"… ({count(sum(map(len, runs[most:])), 'more host')})")
    return ", ".join(shown)


def spread(values: Sequence[float], show: Callable[[float], str]) -> str:
    """``10.1 ms-10.6 ms (median 10.3 ms)``; one value when they are all the same; ``-`` for
    none."""
    if not values:
        return "-"
    import statistics  # here: it costs a launch ~5 ms (decimal, fractions), and few reports need it

    low, high = min(values), max(values)
    if show(low) == show(high):
        return show(low)
    return f"{show(low)}-{show(high)} (median {show(statistics.median(values))})"


def summarised(n: int) -> bool:
    """Whether a report of ``n`` instances sums them up rather than listing each."""
    return n > THRESHOLD
