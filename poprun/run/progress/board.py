"""The progress board: each instance's latest figures, from the progress records it sends.

An instance that imports ``popdist`` under poprun writes a progress record to its stderr
about once a second (:mod:`popdist.progress`): one line, :data:`~popdist.progress.MARKER`,
the job's secret, a space and a JSON object. The router (:mod:`poprun.run.output.router`)
takes the line out of the output and hands it to :meth:`ProgressBoard.update`, which keeps
the instance's figures (:class:`InstanceFigures`) and the collectives it last issued
(:class:`CollectiveCall`), by sequence number, so that two instances' calls at one sequence
number can be compared (:meth:`ProgressBoard.desync`).

Times on the board are poprun's monotonic clock: an instance's own clock never leaves it;
a record says how long ago its collective started, and the board subtracts that from the
time the record arrived.

The supervisor's thread updates the board; the status endpoint's thread reads it
(:meth:`ProgressBoard.snapshot`): a lock keeps the two apart.

A record costs the board the same whatever the job's size (issue 53): the desync check looks
each call up by its sequence number among the signatures seen there (one per kind of call,
the lowest instance that issued it), not in every other instance's calls; the board counts
the instances that are exiting instead of asking each; and the host watch takes the reports
that arrived since it last asked (:meth:`ProgressBoard.take_reports`), not a snapshot. Its
memory is one record per instance and :data:`KEPT_CALLS` sequence numbers for the job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from popdist.progress import MARKER

#: How many of the job's latest sequence numbers the board compares calls at.
KEPT_CALLS = 256
MARKER_BYTES = MARKER.encode()


class CollectiveCall(NamedTuple):
    """One collective an instance issued."""

    seq: int
    kind: str
    name: str
    nbytes: int
    shape: tuple[int, ...]
    dtype: str
    #: Where the program called it: ``file:line in function``.
    site: str
    #: When it started, on poprun's monotonic clock.
    started: float

    @property
    def signature(self) -> tuple[str, tuple[int, ...], str]:
        """What every instance's call at one sequence number must share."""
        return (self.kind, self.shape, self.dtype)

    def describe(self) -> str:
        """``#7 allreduce 'name' (16, 4) float32``."""
        name = f" {self.name!r}" if self.name else ""
        tensor = f" {self.shape} {self.dtype}" if self.dtype else ""
        return f"#{self.seq} {self.kind}{name}{tensor}"


class Frame(NamedTuple):
    """One frame of a thread's stack."""

    file: str
    line: int
    function: str
    text: str = ""


class ThreadStack(NamedTuple):
    """One thread's innermost frames, innermost first."""

    thread: str
    frames: tuple[Frame, ...]


class InstanceFigures(NamedTuple):
    """One instance as its last progress record showed it."""

    instance: int
    host: str
    steps: int
    samples: int
    #: Mean duration of a step (an executor call), seconds; 0 before the first.
    step_time_s: float
    #: Time spent waiting in collectives, seconds.
    wait_s: float
    #: Collectives finished.
    collectives: int
    bytes_reduced: int
    rss_bytes: int
    rss_peak_bytes: int
    #: poprun monotonic time of its last progress (a collective issued or finished, a step).
    last_progress: float
    #: The collective it waits in now, if any.
    pending: CollectiveCall | None
    pid: int = 0
    #: Collectives issued (the sequence number of the last one).
    issued: int = 0
    #: When its last record arrived (poprun monotonic time).
    reported_at: float = 0.0
    #: Its threads' stacks, when it had made no progress for a while (``--hang-timeout``).
    stacks: tuple[ThreadStack, ...] = ()
    #: The collective that raised in it, and the error.
    failed: CollectiveCall | None = None
    failure: str = ""
    #: Its program has ended: it is exiting (its last record).
    exiting: bool = False


class Desync(NamedTuple):
    """Two instances issued different collectives at one sequence number."""

    seq: int
    first: tuple[int, str, CollectiveCall]  # instance, host, call
    second: tuple[int, str, CollectiveCall]


def parse_line(line: bytes, secret: str) -> dict[str, Any] | None:
    """The JSON object of one progress line carrying ``secret``; None for anything else."""
    text = line.strip()
    if not text.startswith(MARKER_BYTES):
        return None
    head, _, body = text[len(MARKER_BYTES) :].partition(b" ")
    if not secret or head.decode("utf-8", "replace") != secret:
        return None
    import json  # here: a job whose instances report nothing never pays for it at launch

    try:
        fields = json.loads(body)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) and isinstance(fields.get("instance"), int) else None


def _call(raw: Any, now: float) -> CollectiveCall | None:
    """A record's call ``[seq, kind, name, nbytes, shape, dtype, [file, line, fn], age]``."""
    if not isinstance(raw, list) or len(raw) < 8:
        return None
    try:
        seq, kind, name, nbytes, shape, dtype, site, age = raw[:8]
        file, line, function = site
        return CollectiveCall(
            seq=int(seq),
            kind=str(kind),
            name=str(name),
            nbytes=int(nbytes),
            shape=tuple(int(n) for n in shape),
            dtype=str(dtype),
            site=f"{file}:{int(line)} in {function}",
            started=now - float(age),
        )
    except (TypeError, ValueError):
        return None


def _signature(raw: Any) -> tuple[int, tuple[str, tuple[int, ...], str]] | None:
    """A record's call as the desync check needs it: its sequence number and signature
    (cheaper than the whole :class:`CollectiveCall`, which is built only when kept)."""
    if not isinstance(raw, list) or len(raw) < 8:
        return None
    try:
        return int(raw[0]), (str(raw[1]), tuple(int(n) for n in raw[4]), str(raw[5]))
    except (TypeError, ValueError):
        return None


def _stacks(raw: Any) -> tuple[ThreadStack, ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for thread in raw:
        try:
            frames = tuple(
                Frame(str(f[0]), int(f[1]), str(f[2]), str(f[3]) if len(f) > 3 else "")
                for f in thread["frames"]
            )
            out.append(ThreadStack(str(thread["thread"]), frames))
        except (KeyError, TypeError, ValueError, IndexError):
            continue
    return tuple(out)


class _Instance:
    __slots__ = ("compared", "counters", "figures")

    def __init__(self, figures: InstanceFigures, counters: tuple[int, int, int]) -> None:
        self.figures = figures
        self.counters = counters
        #: The highest sequence number of its recent calls compared so far (a record repeats
        #: its last few calls: those already compared are not again).
        self.compared = 0


#: One sequence number's calls: each signature, with the lowest instance that issued it.
_Seen = dict[tuple[str, tuple[int, ...], str], tuple[int, str, CollectiveCall]]


class ProgressBoard:
    """Every instance's latest figures; fed by the router, read by anyone (thread-safe)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._instances: dict[int, _Instance] = {}
        self._desync: Desync | None = None
        self._by_seq: dict[int, _Seen] = {}
        self._oldest = 0  # the lowest sequence number still kept in _by_seq
        self._exiting = 0  # instances whose last record says they are exiting
        self._latest = 0.0  # the latest progress of any instance
        self._reports: dict[int, float] = {}  # instance -> its record's time, not yet taken

    def update(self, fields: dict[str, Any]) -> bool:
        """Take one instance's record; whether it shows progress since its last one (its
        first record shows progress when it issued a collective or ran a step)."""
        now = self.clock()
        index = int(fields["instance"])
        num = _numbers(fields)
        exiting = bool(fields.get("exiting"))
        counters = (num["seq"], num["done"], num["steps"] + exiting)  # ending: progress too
        recent = fields.get("recent") or ()
        pending = _call(fields.get("pending"), now)
        failed = _call(fields.get("failed"), now)
        with self._lock:
            known = self._instances.get(index)
            moved = counters != (known.counters if known is not None else (0, 0, 0))
            last = now if moved or known is None else known.figures.last_progress
            steps = num["steps"]
            figures = InstanceFigures(
                instance=index,
                host=str(fields.get("host", "")),
                steps=steps,
                samples=num["samples"],
                step_time_s=num["step_s"] / steps if steps else 0.0,
                wait_s=num["wait_s"],
                collectives=num["done"],
                bytes_reduced=num["bytes"],
                rss_bytes=num["rss"],
                rss_peak_bytes=num["rss_peak"],
                last_progress=last,
                pending=pending,
                pid=num["pid"],
                issued=num["seq"],
                reported_at=now,
                stacks=_stacks(fields.get("stacks")),
                failed=failed,
                failure=str(fields.get("failure") or ""),
                exiting=exiting,
            )
            entry = known
            if entry is None:
                entry = self._instances[index] = _Instance(figures, counters)
            else:
                self._exiting -= entry.figures.exiting
                entry.figures, entry.counters = figures, counters
            self._exiting += exiting
            self._latest = max(self._latest, last)
            self._reports[index] = now
            compared = entry.compared
            for raw in recent:
                got = _signature(raw)
                if got is not None and got[0] > compared:
                    self._compare(index, figures.host, got, raw, now)
                    entry.compared = max(entry.compared, got[0])
            for call in (pending, failed):
                if call is not None:
                    self._compare(index, figures.host, (call.seq, call.signature), call, now)
        return moved

    def _compare(
        self,
        index: int,
        host: str,
        got: tuple[int, tuple[str, tuple[int, ...], str]],
        raw: Any,
        now: float,
    ) -> None:
        """Whether the call differs from another instance's at its sequence number: the
        lowest instance with another signature there is named (constant time a call). The
        call (``raw``: a record's list, or a :class:`CollectiveCall`) is built only when kept
        or named."""
        seq, signature = got
        if seq < self._oldest:
            return  # older than every number kept: nothing left to compare it with
        seen = self._by_seq.setdefault(seq, {})
        kept = seen.get(signature)
        others = (
            []
            if self._desync is not None or (len(seen) == 1 and kept is not None)
            else [rep for sig, rep in seen.items() if sig != signature and rep[0] != index]
        )
        if others or kept is None or index < kept[0]:
            call = raw if isinstance(raw, CollectiveCall) else _call(raw, now)
            if call is None:
                return
            if others:
                peer = min(others, key=lambda side: side[0])
                first, second = sorted(((index, host, call), peer), key=lambda side: side[0])
                self._desync = Desync(seq, first, second)
            if kept is None or index < kept[0]:
                seen[signature] = (index, host, call)
        if seq - self._oldest >= KEPT_CALLS:  # forget the oldest numbers
            oldest = seq - KEPT_CALLS + 1
            if oldest - self._oldest > KEPT_CALLS:  # a jump: sweep once
                self._by_seq = {n: s for n, s in self._by_seq.items() if n >= oldest}
            else:
                for n in range(self._oldest, oldest):
                    self._by_seq.pop(n, None)
            self._oldest = oldest

    def snapshot(self) -> list[InstanceFigures]:
        """Every instance that reported, by index."""
        with self._lock:
            return [self._instances[i].figures for i in sorted(self._instances)]

    def finishing(self) -> bool:
        """Whether every instance that reported has ended its program (the job is ending)."""
        with self._lock:
            return bool(self._instances) and self._exiting == len(self._instances)

    def take_reports(self) -> dict[int, float]:
        """Each instance heard from since the last call, and when its latest record came."""
        with self._lock:
            reports, self._reports = self._reports, {}
            return reports

    def desync(self) -> Desync | None:
        """The first two calls found to differ at one sequence number, if any."""
        with self._lock:
            return self._desync

    def last_progress(self) -> float | None:
        """When any instance last made progress (None: none reported yet)."""
        with self._lock:
            return self._latest if self._instances else None

    def shift(self, seconds: float) -> None:
        """poprun was stopped (Ctrl-Z) this long: the instances' quiet time does not count."""
        with self._lock:
            for entry in self._instances.values():
                f = entry.figures
                entry.figures = _shifted(f, seconds)
            self._latest += seconds


def _shifted(f: InstanceFigures, seconds: float) -> InstanceFigures:
    pending = f.pending
    if pending is not None:
        pending = pending._replace(started=pending.started + seconds)
    return f._replace(last_progress=f.last_progress + seconds, pending=pending)


_NUMBERS: tuple[tuple[str, type], ...] = (
    ("seq", int),
    ("done", int),
    ("steps", int),
    ("samples", int),
    ("step_s", float),
    ("wait_s", float),
    ("bytes", int),
    ("rss", int),
    ("rss_peak", int),
    ("pid", int),
)


def _numbers(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind in _NUMBERS:
        try:
            out[name] = kind(fields.get(name) or 0)
        except (TypeError, ValueError):
            out[name] = kind(0)
    return out
