"""What poprun says of a job that stopped moving, or whose instances are out of step (pure).

From the progress board's figures (:mod:`poprun.run.progress.board`):
:func:`hang_report` is the verdict on a hung job (``--hang-timeout``): which instances wait in
which collective, which are missing and where they are (their innermost frames), on which
host; :func:`wait_note` is the one-time note on a long wait (one instance busy outside any
collective, a long evaluation say, while the others wait for it); :func:`desync_report` names
the two different collectives issued at one sequence number.
"""

from __future__ import annotations

from collections.abc import Sequence

from poprun import summary
from poprun.run.progress.board import CollectiveCall, Desync, InstanceFigures, ThreadStack

#: Innermost frames shown of an instance's main thread, and of each of its other threads.
MAIN_FRAMES = 8
OTHER_FRAMES = 3
#: A record older than this (seconds) says its reporter thread could not run.
STALE_S = 5.0
#: Threads of the libraries, not the program's: shown only when nothing else is.
_QUIET_THREADS = ("popdist-progress",)


def _where(f: InstanceFigures) -> str:
    return f"host {f.host or '?'}, pid {f.pid or '?'}"


def _call_text(call: CollectiveCall) -> str:
    return f"{call.describe()}, called at {call.site}"


def stack_lines(stacks: Sequence[ThreadStack], indent: str = "    ") -> list[str]:
    """The threads' innermost frames, innermost first; the main thread in full."""
    lines: list[str] = []
    ordered = sorted(stacks, key=lambda s: (s.thread != "MainThread", s.thread))
    for stack in ordered:
        if stack.thread in _QUIET_THREADS:
            continue
        limit = MAIN_FRAMES if stack.thread == "MainThread" else OTHER_FRAMES
        lines.append(f"{indent}thread {stack.thread} (innermost first):")
        for frame in stack.frames[:limit]:
            lines.append(f'{indent}  File "{frame.file}", line {frame.line}, in {frame.function}')
            if frame.text:
                lines.append(f"{indent}    {frame.text}")
        if len(stack.frames) > limit:
            lines.append(f"{indent}  ...")
    return lines


def innermost(f: InstanceFigures) -> str:
    """Where the main thread is: ``file:line in function``, or "" when unknown."""
    for stack in f.stacks:
        if stack.thread == "MainThread" and stack.frames:
            top = stack.frames[0]
            return f"{top.file}:{top.line} in {top.function}"
    return ""


def hang_report(
    figures: Sequence[InstanceFigures],
    instances: Sequence[tuple[int, str]],
    *,
    now: float,
    timeout: float,
) -> str:
    """The verdict on a job in which no instance made progress for ``timeout`` seconds.

    ``instances``: every instance of the job and its host (some may never have reported).
    Past :data:`poprun.summary.THRESHOLD` instances, those that wait are counted by the
    collective they wait in, and at most :data:`poprun.summary.TOP` of the others are shown
    with their stacks.
    """
    waiting = [f for f in figures if f.pending is not None]
    missing = [f for f in figures if f.pending is None]
    lines = [
        f"poprun: the job is hung: no instance has made progress for {timeout:g} s "
        f"(--hang-timeout={timeout:g})"
    ]
    furthest = max((f.issued for f in figures), default=0)
    lines += _waiting_lines(waiting, now)
    behind = [f for f in waiting if f.issued < furthest]
    if waiting and not missing and len({f.pending.seq for f in waiting if f.pending}) == 1:
        lines.append(_same_collective(waiting))
    for f in missing[: summary.TOP]:
        lines += _missing_lines(f, waiting, now)
    lines += _more(missing, "in no collective")
    for f in behind[: summary.TOP]:
        lines.append(f"poprun: instance {f.instance} is behind the others; where it is:")
        lines.extend(_stack_or_why(f, now))
    lines += _more(behind, "behind the others")
    reported = {f.instance for f in figures}
    silent = [(index, host) for index, host in instances if index not in reported]
    if summary.summarised(len(silent)):
        lines.append(
            f"poprun: {summary.count(len(silent), 'instance')} "
            f"({summary.ranges(i for i, _ in silent)}) on {summary.hosts(h for _, h in silent)} "
            f"sent no progress record: they have not imported popdist, or are stuck before that"
        )
    else:
        for index, host in silent:
            lines.append(
                f"poprun: instance {index} (host {host}) sent no progress record: it has not "
                f"imported popdist, or it is stuck before that"
            )
    return "\n".join(lines)


def _waiting_lines(waiting: Sequence[InstanceFigures], now: float) -> list[str]:
    """Each waiting instance and its collective, or past the threshold each collective and
    the instances waiting in it."""
    if not summary.summarised(len(waiting)):
        return [
            f"poprun: instance {f.instance} ({_where(f)}) waits in collective "
            f"{_call_text(f.pending)}, for {max(0.0, now - f.pending.started):.0f} s"
            for f in waiting
            if f.pending is not None
        ]
    calls: dict[tuple[int, str, str], list[InstanceFigures]] = {}
    for f in waiting:
        if f.pending is not None:
            calls.setdefault((f.pending.seq, f.pending.kind, f.pending.name), []).append(f)
    lines = []
    for group in list(calls.values())[: summary.TOP]:
        first = group[0].pending
        assert first is not None
        ages = [max(0.0, now - f.pending.started) for f in group if f.pending is not None]
        lines.append(
            f"poprun: {summary.count(len(group), 'instance')} "
            f"({summary.ranges(f.instance for f in group)}) on "
            f"{summary.hosts(f.host or '?' for f in group)} wait in collective "
            f"{_call_text(first)}, for {_seconds(min(ages), max(ages))}"
        )
    if len(calls) > summary.TOP:
        lines.append(f"poprun: … and {summary.count(len(calls) - summary.TOP, 'more collective')}")
    return lines


def _seconds(low: float, high: float) -> str:
    return f"{low:.0f} s" if f"{low:.0f}" == f"{high:.0f}" else f"{low:.0f}-{high:.0f} s"


def _missing_lines(f: InstanceFigures, waiting: Sequence[InstanceFigures], now: float) -> list[str]:
    if f.exiting:
        return [
            f"poprun: instance {f.instance} ({_where(f)}) has ended its program (it issued "
            f"{f.issued} collectives) while others wait: it left the job early"
        ]
    what = (
        f"is missing: it is in no collective (it issued {f.issued}; instance "
        f"{waiting[0].instance} waits in #{waiting[0].pending.seq})"
        if waiting and waiting[0].pending is not None
        else f"is in no collective (it issued {f.issued})"
    )
    return [f"poprun: instance {f.instance} ({_where(f)}) {what}", *_stack_or_why(f, now)]


def _more(shown: Sequence[InstanceFigures], what: str) -> list[str]:
    """The line for those past the first :data:`poprun.summary.TOP` (none when no more)."""
    rest = shown[summary.TOP :]
    if not rest:
        return []
    return [
        f"poprun: … and {summary.count(len(rest), 'more instance')} {what} "
        f"({summary.ranges(f.instance for f in rest)})"
    ]


def _same_collective(waiting: Sequence[InstanceFigures]) -> str:
    """Why every instance waits at one sequence number: under different names (Horovod
    matches collectives by name, so each waits for a name its peers never issue), or the
    collective itself does not finish."""
    names = {f.pending.name for f in waiting if f.pending is not None}
    if len(names) > 1:
        return (
            "poprun: every instance waits in collective "
            f"#{waiting[0].pending.seq if waiting[0].pending else '?'}, but under different "
            "names: a backend that matches collectives by name (Horovod) waits for a name the "
            "other instances never issue; every instance must name its collectives alike"
        )
    return (
        "poprun: every instance waits in the same collective: the collective itself does "
        "not finish (the network, or the backend)"
    )


def _stack_or_why(f: InstanceFigures, now: float) -> list[str]:
    if now - f.reported_at > STALE_S:
        return [
            f"    its last record is {now - f.reported_at:.0f} s old: a thread holds the GIL "
            f"(a C call that never returns), or the process is stopped"
        ]
    if not f.stacks:
        return ["    its stack did not arrive (no record since it stopped moving)"]
    return stack_lines(f.stacks)


def wait_note(figures: Sequence[InstanceFigures], *, now: float, timeout: float) -> str:
    """The note on a long wait: who waits, for whom, and where the busy ones are ("" if no one
    waits or no one is busy)."""
    waiting = [f for f in figures if f.pending is not None]
    busy = [f for f in figures if f.pending is None]
    if not waiting or not busy:
        return ""
    first = min(waiting, key=lambda f: f.pending.started if f.pending else now)
    assert first.pending is not None
    who = ", ".join(str(f.instance) for f in waiting)
    if summary.summarised(len(waiting)):
        who = f"{summary.ranges(f.instance for f in waiting)} ({len(waiting):,})"
    where = "; ".join(
        f"instance {f.instance} ({_where(f)})" + (f" at {innermost(f)}" if innermost(f) else "")
        for f in busy[: summary.TOP]
    )
    if len(busy) > summary.TOP:
        more = busy[summary.TOP :]
        where += f"; {len(more):,} more ({summary.ranges(f.instance for f in more)})"
    return (
        f"poprun: note: instance{'s' if len(waiting) > 1 else ''} {who} "
        f"{'have' if len(waiting) > 1 else 'has'} waited "
        f"{max(0.0, now - first.pending.started):.0f} s in collective "
        f"{first.pending.describe()} for {where}, busy outside any collective (a long "
        f"evaluation?); poprun calls the job hung only after {timeout:g} s without progress "
        f"(--hang-timeout)"
    )


def desync_report(desync: Desync) -> str:
    """The two different collectives at one sequence number, with their call sites."""
    lines = [
        f"poprun: the instances are out of step: they issued different collectives as "
        f"collective #{desync.seq}"
    ]
    for index, host, call in (desync.first, desync.second):
        size = f", {call.nbytes} bytes" if call.nbytes else ""
        lines.append(
            f"poprun:   instance {index} (host {host}): {call.kind}"
            f"{f' {call.name!r}' if call.name else ''} shape {call.shape} {call.dtype or '-'}"
            f"{size}, called at {call.site}"
        )
    lines.append(
        "poprun: every instance must issue the same collectives, with the same shapes and "
        "dtypes, in the same order"
    )
    return "\n".join(lines)
