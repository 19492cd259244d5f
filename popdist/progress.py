"""Progress, measured where it happens: an instance's collectives and steps, reported to poprun.

When poprun asks (``POPDIST_PROGRESS`` holds the job's secret, :mod:`popdist.env`), every
collective the project issues through :mod:`popdist.collectives` gets a per-instance
sequence number, its kind, name, size, shape, dtype, call site and start time
(:func:`instrument` wraps a backend object's methods), and the executor counts its steps and
samples (:func:`leave`). The executor's gradient allreduces of one weight update are one
record, a :class:`Group` described once, so a step's cost does not grow with its number of
gradients. What the hot path does is a counter increment and a tuple store;
everything else happens on a reporter thread, which writes one marked line to the
instance's stderr about once a second (:data:`INTERVAL_S`), or at once when a collective has
been waited for longer than :data:`PENDING_S`. Like the error record
(:mod:`popdist.error_record`) the line reaches poprun through the instance's stderr, the
channel mpirun forwards from every host (one host, ssh, a Slurm allocation), and poprun's
router takes it out of the output; the secret keeps a program's own output from passing
for one.

The reporter, not a signal handler, gathers the stacks of the instance's threads: when the
instance has made no progress for ``POPDIST_PROGRESS_STACKS`` seconds (poprun sets it to half
of ``--hang-timeout``), each record carries every thread's innermost frames, so poprun has
them when it calls the job hung. The thread needs the GIL only, which an instance blocked in a
collective (MPI, gloo and Horovod wait without it), in ``time.sleep`` or on a lock has
released.

A collective that raises marks the instance as failed: its record goes out at once (poprun
compares it with its peers': a *desync*), and the process ends with exit code 1 when the
interpreter exits (:func:`_end_after_failure`), even if the program swallowed the error,
because finalising a backend whose peers are out of step hangs (MPI's finalize waits for
them); mpirun then ends the others.

Without ``POPDIST_PROGRESS`` nothing is wrapped and no thread starts: a plain ``python
script.py`` pays nothing. Stdlib only.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time

from popdist.env import PROGRESS, PROGRESS_STACKS, reported_as

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import FrameType
    from typing import Any

    # A call: (seq, kind, name, nbytes, shape, dtype, site, started), site (file, line, function).
    Call = tuple[Any, ...]

#: Starts a progress line; the job's secret and one space follow, then a JSON object.
MARKER = "\x1fpopdist-progress="
#: How often the reporter writes a record (seconds).
INTERVAL_S = 1.0
#: A collective waited for this long is reported at once, not at the next interval.
PENDING_S = 0.5
#: How often the reporter looks (a fraction of the above).
TICK_S = 0.25
#: How many of the last collectives each record repeats (poprun compares them: desync).
RECENT = 8
#: How many innermost frames of each thread a record carries.
STACK_FRAMES = 12

#: The methods :func:`instrument` wraps: the name, its kind in the records, and how it
#: waits (``async``: issued now, waited by ``wait``; ``wait``; ``call``: issued and waited).
TRACED: tuple[tuple[str, str, str], ...] = (
    ("allreduce_async_", "allreduce", "async"),
    ("wait", "wait", "wait"),
    ("allreduce_", "allreduce", "call"),
    ("broadcast_", "broadcast", "call"),
    ("allgather", "allgather", "call"),
    ("barrier", "barrier", "call"),
    ("broadcast_tensors", "broadcast_tensors", "call"),
    ("broadcast_object", "broadcast_object", "call"),
    ("broadcast_optimizer_state", "broadcast_optimizer_state", "call"),
)


class Tracker:
    """This process's collectives and steps, counted on the hot path, read by the reporter."""

    def __init__(self) -> None:
        self.seq = 0  # collectives issued
        self.done = 0  # collectives finished
        self.steps = 0
        self.samples = 0
        self.step_s = 0.0  # summed duration of the steps
        self.wait_s = 0.0  # summed time blocked in collectives
        self.bytes_reduced = 0
        self.depth = 0  # a traced call inside another is part of it
        self.blocked: Call | None = None  # the collective the program waits in now
        self.blocked_since = 0.0
        self.inflight: dict[Any, list[Call]] = {}  # handle -> the allreduces it stands for
        self.recent: collections.deque[Call] = collections.deque(maxlen=RECENT)
        self.failed: Call | None = None
        self.failure = ""
        #: Where the executor call now running was made (:func:`enter`): the site of every
        #: collective it issues, found once per call rather than walked to per collective.
        self.site: tuple[str, int, str] | None = None


#: The process's tracker; ``None`` when poprun did not ask (nothing is counted).
tracker: Tracker | None = None
_reporter: Reporter | None = None
_skip: tuple[str, ...] = ()  # file prefixes of the libraries between the program and a collective
#: id of a code object -> (the code object, whether it is a library's): one prefix test per
#: function, not per call. Keyed by id: hashing a code object hashes its constants and names
#: on every call; the entry holds the code object, so its id cannot be reused meanwhile.
_in_library: dict[int, tuple[Any, bool]] = {}
#: (id of a code object, offset of its instruction) -> the site: a frame's line number is
#: found by walking its function's line table, thousands of instructions in a long function
#: (a training script's main loop), on every collective. Valid while ``_in_library`` holds
#: the code object: both are cleared together.
_sites: dict[tuple[int, int], tuple[str, int, str]] = {}
_IN_LIBRARY_MAX = 4096  # forgotten beyond this (a program that compiles code on the fly)


def _site() -> tuple[str, int, str]:
    """The innermost frame outside popdist, its executor, Lightning and torch: who called."""
    try:  # past _site, _issue and the wrapper (popdist's own: no need to look at them)
        frame: FrameType | None = sys._getframe(3)
    except ValueError:  # the wrapper called with nothing above it
        frame = sys._getframe(2)
    return _site_from(frame)


def _site_from(frame: FrameType | None) -> tuple[str, int, str]:
    """The first frame from ``frame`` outwards that is not a library's (or ``frame``'s own)."""
    global _skip
    if not _skip:
        _skip = _library_prefixes()
    known = _in_library
    first: FrameType | None = frame
    for _ in range(64):
        if frame is None:
            break
        code = frame.f_code
        entry = known.get(id(code))
        if entry is None:
            if len(known) >= _IN_LIBRARY_MAX:
                known.clear()
                _sites.clear()
            entry = known[id(code)] = (code, code.co_filename.startswith(_skip))
        if not entry[1]:
            where = (id(code), frame.f_lasti)
            site = _sites.get(where)
            if site is None:
                if len(_sites) >= _IN_LIBRARY_MAX:
                    _sites.clear()
                site = _sites[where] = (code.co_filename, frame.f_lineno, code.co_name)
            return site
        frame = frame.f_back
    if first is None:
        return ("?", 0, "?")
    return (first.f_code.co_filename, first.f_lineno, first.f_code.co_name)


def _library_prefixes() -> tuple[str, ...]:
    prefixes = [os.path.dirname(os.path.abspath(__file__)) + os.sep]
    for name in ("popdist_torch", "popdist_lightning", "torch", "lightning", "pytorch_lightning"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            prefixes.append(os.path.dirname(os.path.abspath(path)) + os.sep)
    prefixes.append(os.path.dirname(threading.__file__) + os.sep + "threading.py")
    prefixes.append(os.path.dirname(threading.__file__) + os.sep + "contextlib.py")
    return tuple(prefixes)


def _issue(t: Tracker, kind: str, name: str | None, tensor: Any) -> Call:
    t.seq = seq = t.seq + 1
    try:  # a tensor (torch or numpy): three attribute reads, no test first
        shape, dtype, nbytes = tensor.shape, tensor.dtype, tensor.nbytes
    except AttributeError:
        name, shape, dtype, nbytes = _described(kind, name, tensor)
    call = (seq, kind, name or "", nbytes, shape, dtype, t.site or _site(), time.monotonic())
    t.recent.append(call)
    return call


def _described(kind: str, name: str | None, tensor: Any) -> tuple[Any, ...]:
    """What :func:`_issue` records of an argument that is not one tensor: its elements and
    bytes through ``numel``/``element_size`` where it has them, ``broadcast_tensors``' list
    as one call, anything else as nothing."""
    if tensor is not None and hasattr(tensor, "element_size"):
        return name, tuple(tensor.shape), tensor.dtype, tensor.numel() * tensor.element_size()
    if kind == "broadcast_tensors" and isinstance(tensor, (list, tuple)) and tensor:
        return _members(tensor, name)
    return name, (), "", 0


def _members(tensors: list[Any] | tuple[Any, ...], name: str | None) -> tuple[Any, ...]:
    """``broadcast_tensors``' ``(name, tensor)`` pairs as one call: ``N tensors``, all their
    elements as one flat shape, the dtype they share (or ``mixed``). Peers whose parameters
    differ in size then differ here and poprun names both calls (Horovod checks each tensor
    itself and raises on every instance; torch's flat broadcast would copy garbage silently).
    A list or a tuple only (an iterator would be used up); never ``broadcast_object``'s
    argument, which only the root passes."""
    numel = nbytes = 0
    dtypes = set()
    for member in tensors:
        tensor = member[1] if isinstance(member, tuple) and len(member) == 2 else member
        if not hasattr(tensor, "element_size"):
            return name, (), "", 0
        numel += tensor.numel()
        nbytes += tensor.numel() * tensor.element_size()
        dtypes.add(str(tensor.dtype))
    dtype = dtypes.pop() if len(dtypes) == 1 else "mixed"
    return name or f"{len(tensors)} tensors", (numel,), dtype, nbytes


def _fail(t: Tracker, call: Call, error: BaseException) -> None:
    if isinstance(error, KeyboardInterrupt) or t.failed is not None:
        return
    t.failed = call
    t.failure = f"{type(error).__name__}: {error}"
    import atexit

    atexit.register(_end_after_failure)  # registered last: runs first
    if _reporter is not None:
        _reporter.emit()


def _end_after_failure() -> None:
    """At interpreter exit after a failed collective: exit 1 now, before any backend is
    finalised (it would wait for peers that are out of step)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream must not stop the exit
            continue
    os._exit(1)


def _wrap(t: Tracker, method: Callable[..., Any], kind: str, mode: str) -> Callable[..., Any]:
    if mode == "async":
        return _wrap_async(t, method, kind)
    if mode == "wait":
        return _wrap_wait(t, method)
    return _wrap_call(t, method, kind)


def _wrap_async(t: Tracker, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """An asynchronous allreduce: issued now, done when its handle is waited for.

    The gradient hooks call it for every gradient of every step, so it takes the
    interface's own keywords (:meth:`~popdist.collectives.base.Collectives.allreduce_async_`)
    rather than ``**kwargs`` (a dictionary built and unpacked again a call), and it records
    the call itself, as :func:`_issue` does for the other collectives (issue 33).
    """
    inflight, recent, monotonic = t.inflight, t.recent, time.monotonic

    def issue(tensor: Any, *, average: bool = False, name: str | None = None) -> Any:
        if t.depth:
            return method(tensor, average=average, name=name)
        t.seq = seq = t.seq + 1
        try:
            shape, dtype, nbytes = tensor.shape, tensor.dtype, tensor.nbytes
        except AttributeError:
            name, shape, dtype, nbytes = _described(kind, name, tensor)
        site = t.site or _site_from(sys._getframe(1))
        call = (seq, kind, name or "", nbytes, shape, dtype, site, monotonic())
        recent.append(call)
        t.bytes_reduced += nbytes
        try:
            handle = method(tensor, average=average, name=name)
        except BaseException as error:
            _fail(t, call, error)
            raise
        try:
            calls = inflight.get(handle)
        except TypeError:  # an unhashable handle: counted as done at once
            t.done += 1
            return handle
        if calls is None:
            inflight[handle] = [call]
        else:  # a handle that stands for several (the torch backend's bucket)
            calls.append(call)
        return handle

    return issue


def _wrap_wait(t: Tracker, method: Callable[..., Any]) -> Callable[..., Any]:
    """Waiting for a handle: the program blocks in the allreduces it stands for."""
    inflight, monotonic = t.inflight, time.monotonic

    def wait(handle: Any) -> Any:
        if t.depth:
            return method(handle)
        try:
            calls = inflight.pop(handle, None)
        except TypeError:
            calls = None
        t.depth = 1
        t.blocked = calls[0] if calls else None
        start = t.blocked_since = monotonic()
        try:
            return method(handle)
        except BaseException as error:
            if t.blocked is not None:
                _fail(t, t.blocked, error)
            raise
        finally:
            t.depth = 0
            t.blocked = None
            t.wait_s += monotonic() - start
            if calls:
                t.done += len(calls)

    return wait


def _wrap_call(t: Tracker, method: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """A collective issued and waited for in one call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if t.depth:
            return method(*args, **kwargs)
        tensor = args[0] if args else None
        issued = _issue(t, kind, kwargs.get("name"), tensor)
        if kind == "allreduce":
            t.bytes_reduced += issued[3]
        t.depth += 1
        t.blocked = issued
        start = t.blocked_since = time.monotonic()
        try:
            result = method(*args, **kwargs)
        except BaseException as error:
            _fail(t, issued, error)
            raise
        finally:
            t.depth -= 1
            t.blocked = None
            t.wait_s += time.monotonic() - start
        t.done += 1
        return result

    return call


def instrument(backend: Any) -> Any:
    """Wrap ``backend``'s collectives (instance attributes shadowing its methods) when poprun
    asked for progress; otherwise leave it untouched. Returns ``backend``. Idempotent."""
    t = tracker
    if t is None or getattr(backend, "_progress_traced", False):
        return backend
    plain = {}
    for attribute, kind, mode in TRACED:
        method = getattr(backend, attribute, None)
        if method is not None:
            plain[attribute] = method
            setattr(backend, attribute, _wrap(t, method, kind, mode))
    backend._progress_plain = plain
    backend._progress_traced = True
    return backend


def untraced(backend: Any, attribute: str) -> Callable[..., Any]:
    """``backend``'s own method ``attribute``, under the wrapper :func:`instrument` may have
    put there: for a caller that reports its collectives itself, as a :class:`Group`."""
    plain: dict[str, Callable[..., Any]] = getattr(backend, "_progress_plain", None) or {}
    method: Callable[..., Any] = plain.get(attribute) or getattr(backend, attribute)
    return method


def enter(caller: FrameType) -> tuple[str, int, str] | None:
    """An executor call starts, made from ``caller``: the collectives it issues (a gradient
    hook's, deep in the backward pass, or a pipeline stage thread's) are attributed to the
    first frame outside the libraries from there. Measured in a 2-instance run of a 1.4 ms
    step, walking the stack from each of its four allreduces cost 30 µs a step, 2 % (issue
    33). Returns the site it replaces, for :func:`leave`."""
    t = tracker
    if t is None:
        return None
    outer = t.site
    # A training loop calls from one line: its site is known (one lookup, no walk).
    site = _sites.get((id(caller.f_code), caller.f_lasti))
    t.site = site if site is not None else _site_from(caller)
    return outer


def leave(
    outer: tuple[str, int, str] | None, samples: int = 0, seconds: float | None = None
) -> None:
    """The executor call :func:`enter` saw has ended: raised, or returned ``samples``
    processed in ``seconds`` (a step; one call, not two, on every step)."""
    t = tracker
    if t is not None:
        t.site = outer
        if seconds is not None:
            t.steps += 1
            t.samples += samples
            t.step_s += seconds


# -- groups: collectives described once, recorded once per use -----------------------------
class Group:
    """Collectives a program issues together on every use, described once: the executor's
    gradient allreduces of one weight update are one record per update, not one per gradient.

    On a 2 ms step of four gradients, recording each (its wrapper, a tuple, the clock, the
    handle's bookkeeping, its wait) cost the step 2 %; a group costs the same for any number
    of gradients (issue 33). The record reads as one call: the first member's name and how
    many more, every element as one flat shape, the dtype they share (``mixed`` otherwise);
    instances whose members differ in size differ there, and poprun names both (a desync).
    Its sequence numbers are as many as its members, so ``seq`` still counts collectives.
    """

    __slots__ = ("count", "dtype", "kind", "name", "nbytes", "reduced", "shape")

    def __init__(self, kind: str, names: list[str], tensors: list[Any]) -> None:
        count = len(tensors)
        self.kind = kind
        self.count = count
        self.name = f"{names[0]} and {count - 1} more" if count > 1 else "".join(names[:1])
        self.nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.reduced = self.nbytes if kind == "allreduce" else 0  # what the figures count
        self.shape = (sum(t.numel() for t in tensors),)
        dtypes = {t.dtype for t in tensors}
        self.dtype = dtypes.pop() if len(dtypes) == 1 else "mixed"


def _group_call(t: Tracker, group: Group, site: tuple[str, int, str], now: float) -> Call:
    """``group``'s record, its members' sequence numbers taken: one call in the records."""
    seq = t.seq + 1
    t.seq = seq + group.count - 1
    call = (seq, group.kind, group.name, group.nbytes, group.shape, group.dtype, site, now)
    t.recent.append(call)
    t.bytes_reduced += group.reduced
    return call


def wait_group(group: Group, wait: Callable[[Any], Any], handles: Any) -> None:
    """``wait`` for each of ``handles``, ``group``'s members, issued since the last wait:
    the group goes on the record now, issued as the program blocks in it (all of it is
    issued by then, nothing else in between). Nothing is reported: it just waits.

    Its waits are the backend's own (:func:`untraced`), which call none of its traced
    methods, so nothing inside is counted twice."""
    t = tracker
    if t is None or not group.count:
        for handle in handles:
            wait(handle)
        return
    t.blocked_since = start = time.monotonic()
    t.blocked = call = _group_call(t, group, t.site or _site_from(sys._getframe(1)), start)
    try:
        for handle in handles:
            wait(handle)
    except BaseException as error:
        _fail(t, call, error)
        raise
    finally:
        t.blocked = None
        t.wait_s += time.monotonic() - start
    t.done += group.count


def group_failed(group: Group, error: BaseException) -> None:
    """Issuing a member of ``group`` raised ``error``: the instance has failed (see the
    module's notes); the group is on the record as the failed call."""
    t = tracker
    if t is not None and group.count:
        call = _group_call(t, group, t.site or _site_from(sys._getframe(1)), time.monotonic())
        _fail(t, call, error)


# -- the reporter ---------------------------------------------------------------------------
def _call_fields(call: Call | None, now: float) -> list[Any] | None:
    if call is None:
        return None
    seq, kind, name, nbytes, shape, dtype, site, started = call
    return [seq, kind, name, nbytes, list(shape), str(dtype).removeprefix("torch."), list(site),
            round(now - started, 3)]  # fmt: skip


def _stacks(skip: int) -> list[dict[str, Any]]:
    """Every thread's innermost frames (file, line, function, source line), but ``skip``'s."""
    import linecache

    names = {th.ident: th.name for th in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        frames: list[list[Any]] = []
        f: FrameType | None = frame
        while f is not None and len(frames) < STACK_FRAMES:
            code = f.f_code
            text = linecache.getline(code.co_filename, f.f_lineno).strip()
            frames.append([code.co_filename, f.f_lineno, code.co_name, text])
            f = f.f_back
        out.append({"thread": names.get(ident, f"thread {ident}"), "frames": frames})
    return out


def _rss() -> tuple[int, int]:
    """Resident and peak resident bytes of this process."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        resident = 0
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        peak = resident
    return resident, max(peak, resident)


class Reporter:
    """The thread that writes this instance's progress records to its stderr."""

    def __init__(self, t: Tracker, secret: str, stacks_after: float, environ: Mapping[str, str]):
        self.t = t
        self.secret = secret
        self.stacks_after = stacks_after
        instance, self.host = reported_as(environ)
        self.instance = instance or 0
        self.lock = threading.Lock()
        self.last_emit = 0.0
        self.reported_blocked: Call | None = None
        self.moved_at = time.monotonic()
        self.seen: tuple[int, int, int] = (-1, -1, -1)
        self.exiting = False
        self.thread = threading.Thread(target=self._run, name="popdist-progress", daemon=True)

    def start(self) -> None:
        import atexit

        self.thread.start()
        atexit.register(self.finish)  # registered first: runs after the program's own

    def finish(self) -> None:
        """The program has ended: one last record says so (poprun's hang clock then knows an
        instance that is slow to exit from one that is stuck), and no more."""
        self.exiting = True
        self.emit()

    def record(self, now: float) -> dict[str, Any]:
        """This instance's figures now (what one line carries)."""
        t = self.t
        counters = (t.seq, t.done, t.steps)
        if counters != self.seen:
            self.seen, self.moved_at = counters, now
        blocked = t.blocked
        rss, peak = _rss()
        fields: dict[str, Any] = {
            "instance": self.instance,
            "host": self.host,
            "pid": os.getpid(),
            "seq": t.seq,
            "done": t.done,
            "steps": t.steps,
            "samples": t.samples,
            "step_s": round(t.step_s, 6),
            "wait_s": round(t.wait_s + (now - t.blocked_since if blocked else 0.0), 6),
            "bytes": t.bytes_reduced,
            "rss": rss,
            "rss_peak": peak,
            "idle_s": round(now - self.moved_at, 3),
            "pending": _call_fields(blocked, now),
            "blocked_s": round(now - t.blocked_since, 3) if blocked else 0.0,
            "recent": [_call_fields(c, now) for c in list(t.recent)],
            "failed": _call_fields(t.failed, now),
            "failure": t.failure,
            "exiting": self.exiting,
        }
        if self.stacks_after > 0 and now - self.moved_at >= self.stacks_after:
            fields["stacks"] = _stacks(threading.get_ident())
        return fields

    def emit(self) -> None:
        """Write one record now (the reporter's thread, or a failing collective's)."""
        import json

        with self.lock:
            now = time.monotonic()
            self.last_emit = now
            self.reported_blocked = self.t.blocked
            try:
                line = f"{MARKER}{self.secret} {json.dumps(self.record(now))}\n".encode()
            except Exception:  # a record must never break the program
                return
            try:
                while line:
                    line = line[os.write(2, line) :]
            except OSError:
                pass

    def _run(self) -> None:
        while True:
            time.sleep(TICK_S)
            t = self.t
            now = time.monotonic()
            blocked = t.blocked
            late = (
                blocked is not None
                and blocked is not self.reported_blocked
                and now - t.blocked_since >= PENDING_S
            )
            if self.exiting:
                return
            if late or now - self.last_emit >= INTERVAL_S:
                self.emit()


def _stop_in_child() -> None:
    """A forked child (a DataLoader worker) is not the instance: it reports nothing."""
    global tracker, _reporter
    tracker, _reporter = None, None


def start_if_asked(environ: Mapping[str, str] | None = None) -> bool:
    """Start counting and reporting when poprun asked (``POPDIST_PROGRESS``); idempotent."""
    global tracker, _reporter
    environ = os.environ if environ is None else environ
    secret = environ.get(PROGRESS, "").strip()
    if not secret:
        return False
    if tracker is not None:
        return True
    try:
        stacks_after = float(environ.get(PROGRESS_STACKS, "0") or 0)
    except ValueError:
        stacks_after = 0.0
    tracker = Tracker()
    _reporter = Reporter(tracker, secret, stacks_after, environ)
    _reporter.start()
    os.register_at_fork(after_in_child=_stop_in_child)
    return True
