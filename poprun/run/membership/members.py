"""Membership (pure): which hosts are in the job, its generation, the hosts lost and readmitted.

A job across hosts keeps one :class:`Membership` for its whole life (every attempt). The
supervisor's side (:mod:`poprun.run.membership.watch`) tells it when a host was last heard from (a
progress record or a lease heartbeat from any instance there) and how each probe of a host
ended (does it answer ssh?); the membership says which hosts to probe, and when a host is
*lost*. The ending policy (:mod:`poprun.run.ending`) ends the job on a loss and asks
:meth:`Membership.relaunch` what comes next: the job again on the hosts left (generation + 1),
or the end of the job (fewer than ``--min-hosts`` left).

A host is lost when

- it has been silent for :data:`SILENT_S` (no record from any instance there) *and* it does
  not answer a probe: a silent host that answers is slow or busy (a long evaluation, a C call
  that holds the GIL), never lost; the hang clock (``--hang-timeout``) judges it as before;
- or, once the attempt fails (mpirun announces its abort, :meth:`Membership.failing`), it
  does not answer: every member is asked at once, so a crashed host is named while mpirun
  is still ending the job, not after;
- or (``--min-hosts``) its instances all ended by a signal, and the job's first failure is
  theirs: judged once the attempt has ended (:meth:`Membership.blame`), from how each
  instance ended, mpirun's and Open MPI's reports and the end times
  (:mod:`poprun.run.membership.blame`), never from the order the records arrived in. Where
  that evidence cannot tell whose failure came first, no host is lost.

The launch host is never watched: poprun runs there, so its loss is poprun's, and it ends
the job (as torchrun's rendezvous host or Horovod's driver do).

A host lost :data:`MAX_LOSSES` times is left out for the rest of the job, even with
``--readmit``.

Reads time only from the clock it is given: its unit tests drive it with a fake clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from poprun.run.evidence import ExitRecord, Failure
from poprun.run.membership.blame import SIGNALS, End, FirstFailure, first_failure

#: No record from any instance of a host for this long: ask the host whether it is there.
SILENT_S = 3.0
#: While a silent host answers, ask it again this often.
PROBE_EVERY_S = 3.0
#: How often a lost host is asked whether it answers again (``--readmit``).
READMIT_EVERY_S = 5.0
#: K: a host lost this many times is left out for the rest of the job (``--readmit``).
MAX_LOSSES = 2


@dataclass(frozen=True)
class Loss:
    """One host lost: which, why (one phrase), and when (the membership's clock)."""

    host: str
    why: str
    at: float


@dataclass(frozen=True)
class Next:
    """What comes after an attempt that lost hosts (:meth:`Membership.relaunch`)."""

    #: The hosts of the next attempt, in the original order (empty: the job ends).
    hosts: tuple[str, ...]
    generation: int
    #: One line for poprun's stderr: what was lost and what happens now.
    line: str


@dataclass
class _Host:
    heard_at: float = 0.0
    probing: bool = False
    probed_at: float | None = None
    #: Ask it at once, whatever its silence (the attempt is failing).
    asked: bool = False
    losses: int = 0
    #: Lost now (out of the job until readmitted).
    out: bool = False
    #: Answered again since it was lost (``--readmit``): it rejoins at the next checkpoint.
    back: bool = False


@dataclass
class Membership:
    """Who is in the job; decisions from events and ``clock`` (monotonic seconds)."""

    hosts: tuple[str, ...]
    clock: Callable[[], float]
    #: The host poprun runs on (never watched: its loss is poprun's), if it is one of ``hosts``.
    launch_host: str | None = None
    #: ``--min-hosts`` (None: every host is needed, a loss ends the job).
    min_hosts: int | None = None
    readmit: bool = False
    max_losses: int = MAX_LOSSES
    generation: int = 0
    members: tuple[str, ...] = ()
    _state: dict[str, _Host] = field(default_factory=dict)
    _losses: list[Loss] = field(default_factory=list)  # this attempt's, in order
    _taken: int = 0
    #: This attempt's instances on their hosts.
    _placement: dict[int, str] = field(default_factory=dict)
    #: When this attempt started failing (mpirun's abort), if it has.
    _failing_at: float | None = None

    def __post_init__(self) -> None:
        self.members = self.members or self.hosts
        self._state = {host: _Host(heard_at=self.clock()) for host in self.hosts}

    # --- events -------------------------------------------------------------------------

    def launched(self, placement: Mapping[int, str] | None = None) -> None:
        """An attempt started on :attr:`members` (``placement``: each instance's host): their
        silence counts from now."""
        now = self.clock()
        for host, state in self._state.items():
            state.probing = state.asked = False  # a probe of the last attempt was dropped
            if host in self.members:
                state.heard_at, state.probed_at = now, None
        self._losses, self._taken = [], 0
        self._placement, self._failing_at = dict(placement or {}), None

    def heard(self, host: str, at: float | None = None) -> None:
        """Something of ``host``'s instances reached poprun (at ``at``, default now)."""
        state = self._state.get(host)
        if state is not None:
            state.heard_at = max(state.heard_at, self.clock() if at is None else at)

    def answered(self, host: str, ok: bool, why: str = "") -> None:
        """A probe of ``host`` ended: it answered (``ok``) or not (``why``)."""
        state = self._state[host]
        state.probing, state.probed_at = False, self.clock()
        if state.out:
            state.back = ok and self.readmit and state.losses < self.max_losses
        elif not ok and host in self.members:
            self.lose(host, f"no answer: {why}" if why else "no answer")

    def lose(self, host: str, why: str) -> None:
        """``host`` is lost (once per attempt)."""
        state = self._state.get(host)
        if state is None or state.out or host not in self.members or host == self.launch_host:
            return
        state.out, state.back = True, False
        state.losses += 1
        self._losses.append(Loss(host, why, self.clock()))

    def failing(self) -> None:
        """The attempt is failing (an instance failed, or mpirun announced its abort), with
        ``--min-hosts``: ask every member at once whether it is there. A host that does not
        answer explains the failure: named now, the job ends at once, not after mpirun's own
        ending and a round of probes."""
        if self._failing_at is not None or self.min_hosts is None:
            return
        self._failing_at = self.clock()
        for host in self.watched():
            self._state[host].asked = True

    @property
    def failing_since(self) -> float | None:
        """When this attempt started failing (:meth:`failing`), if it has."""
        return self._failing_at

    def unasked(self) -> tuple[str, ...]:
        """The members (not lost) neither heard from nor answering since the attempt started
        failing (all of them, if it has not): after the attempt, only these need asking."""
        return tuple(h for h in self.watched() if not self._state[h].out and not self._known(h))

    def _known(self, host: str) -> bool:
        """Heard from, or answering a probe, since the attempt started failing."""
        at, state = self._failing_at, self._state[host]
        return at is not None and (state.heard_at > at or (state.probed_at or -1.0) >= at)

    def exited(self, instance: int, returncode: int) -> None:
        """A remote instance's own exit record while nothing else ends the job (no abort, no
        signal of poprun's). With ``--min-hosts``, a failure makes every member be asked at
        once (:meth:`failing`): a host that does not answer explains it, and is named while
        mpirun is still ending the job. Whose failure came first is judged once the attempt
        has ended (:meth:`blame`), from all its evidence, not from this record's arrival."""
        if self.min_hosts is not None and instance in self._placement and returncode != 0:
            self.failing()

    def blame(
        self,
        records: Sequence[tuple[int, ExitRecord]],
        *,
        mpirun_failure: Failure | None = None,
        peers: Sequence[str] = (),
    ) -> str:
        """After an attempt that failed by itself, with ``--min-hosts`` and no host lost: the
        host of the first failure (:func:`~poprun.run.membership.blame.first_failure`) is
        lost when every instance there was killed by a signal (something there kills the
        job: launching there again would not help).

        ``records``: the remote instances' exit records (those after poprun's own kill left
        out); ``mpirun_failure``: the first failure mpirun reported, which stands in for its
        instance's record when that never came; ``peers``: the hosts Open MPI's peer reports
        name. Returns one line when a kill was seen but the evidence cannot tell whose it
        was: no host is lost then, the failure is an instance failure.
        """
        if self.min_hosts is None or self._losses:
            return ""
        place = self._placement
        ends = {i: End(i, place[i], r.returncode, r.ended_at) for i, r in records if i in place}
        named = mpirun_failure.instance if mpirun_failure is not None else None
        if mpirun_failure is not None and named in place and named not in ends:
            stand_in = _returncode(mpirun_failure)
            if stand_in is not None and place[mpirun_failure.instance] != self.launch_host:
                ends[mpirun_failure.instance] = End(named, place[named], stand_in)
        first = first_failure(list(ends.values()), place, mpirun_first=named, peers=peers)
        if first.host is None:
            if any(end.returncode < 0 for end in ends.values()):
                return (
                    f"poprun: no host is lost: {first.why_not}; the job failed as an instance did"
                )
            return ""
        if first.host == self.launch_host:
            return ""  # its loss would be poprun's: an instance failure
        on_host = [i for i, host in place.items() if host == first.host]
        if any(i in ends and ends[i].returncode >= 0 for i in on_host):
            return ""  # an instance there exited by itself: an instance failure
        if not all(i in ends for i in on_host):
            return (
                f"poprun: no host is lost: {first.host} failed first ({' and '.join(first.by)}), "
                "but how its instances ended never reached poprun; the job failed as an "
                "instance did"
            )
        self.lose(first.host, _why(first, ends, place))
        return ""

    # --- questions ----------------------------------------------------------------------

    def watched(self) -> tuple[str, ...]:
        """The members poprun watches: all but the launch host."""
        return tuple(h for h in self.members if h != self.launch_host)

    def to_probe(self) -> list[str]:
        """Hosts to ask now (each is then marked as being asked until :meth:`answered`)."""
        now = self.clock()
        due = []
        members = set(self.members)  # one set a call: a tuple's `in` per host is O(hosts²)
        for host in self.hosts:
            state = self._state[host]
            if state.probing or host == self.launch_host:
                continue
            if state.out:
                wanted = self.readmit and not state.back and state.losses < self.max_losses
                every = READMIT_EVERY_S
            else:
                wanted = host in members and now - state.heard_at >= SILENT_S
                every = PROBE_EVERY_S
            asked = state.asked and not state.out
            if asked or (wanted and (state.probed_at is None or now - state.probed_at >= every)):
                state.probing, state.asked = True, False
                due.append(host)
        return due

    def take_losses(self) -> list[Loss]:
        """The losses since the last call."""
        new = self._losses[self._taken :]
        self._taken = len(self._losses)
        return new

    @property
    def losses(self) -> tuple[Loss, ...]:
        """This attempt's losses, in order."""
        return tuple(self._losses)

    def returning(self) -> tuple[str, ...]:
        """Lost hosts that answer again and may rejoin (``--readmit``; the policy asks at
        every turn: nothing to walk without it)."""
        if not self.readmit:
            return ()
        return tuple(h for h in self.hosts if self._state[h].out and self._state[h].back)

    def is_out(self, host: str) -> bool:
        """Whether ``host`` is lost now (left out of the job)."""
        return self._state[host].out

    def times_lost(self, host: str) -> int:
        return self._state[host].losses

    def next_time(self) -> float | None:
        """When :meth:`to_probe` may next have something to do (None: nothing to wait for)."""
        times = []
        members = set(self.members)
        for host in self.hosts:
            state = self._state[host]
            if state.probing or host == self.launch_host:
                continue
            if state.asked and not state.out:
                times.append(self.clock())
            elif state.out:
                if self.readmit and not state.back and state.losses < self.max_losses:
                    times.append((state.probed_at or 0.0) + READMIT_EVERY_S)
            elif host in members:
                at = state.heard_at + SILENT_S
                if state.probed_at is not None:
                    at = max(at, state.probed_at + PROBE_EVERY_S)
                times.append(at)
        return min(times, default=None)

    def relaunch(self, *, readmitting: bool = False) -> Next:
        """After an attempt that lost hosts (or stopped to readmit some): where next.

        The hosts left, in their original order, when at least ``--min-hosts`` remain
        (generation + 1); else no hosts: the job ends (:data:`poprun.errors.EXIT_HOSTS_LOST`).
        """
        lost = [loss.host for loss in self._losses]
        back = self.returning() if readmitting else ()
        left = tuple(h for h in self.hosts if (h in self.members and h not in lost) or h in back)
        named = ", ".join(f"{loss.host} ({loss.why})" for loss in self._losses)
        need = len(self.hosts) if self.min_hosts is None else self.min_hosts
        if len(left) < need:
            option = f"--min-hosts={self.min_hosts}" if self.min_hosts else "no --min-hosts"
            return Next(
                (), self.generation, f"poprun: lost host {named}: {len(left)} host(s) left, "
                f"fewer than the job needs ({option}): ending the job",
            )  # fmt: skip
        for host in back:
            self._state[host].out = self._state[host].back = False
        self.generation += 1
        self.members = left
        what = f"lost host {named}" if lost else f"readmitting {', '.join(back)}"
        return Next(
            left, self.generation, f"poprun: {what}: launching the job again on "
            f"{', '.join(left)} (generation {self.generation})",
        )  # fmt: skip


def _returncode(failure: Failure) -> int | None:
    """mpirun's report of a failure, ``Popen`` style (None: it did not say how)."""
    if failure.signal is not None:
        return -failure.signal
    return failure.exit_code


def _why(first: FirstFailure, ends: Mapping[int, End], placement: Mapping[int, str]) -> str:
    """``instance 2 killed by SIGKILL first; h2's instance was ended by mpirun``: the first
    failure, the evidence that named it when its signal alone did not, and the hosts whose
    instances mpirun's teardown ended."""
    end = ends[first.instance] if first.instance is not None else None
    what = f"instance {first.instance} {end.how()} first" if end else "its instances failed first"
    if SIGNALS not in first.by:
        what += f" ({' and '.join(first.by)})"
    torn: dict[str, int] = {}
    for instance, host in placement.items():
        ended = ends.get(instance)
        if host != first.host and ended is not None and ended.by_teardown:
            torn[host] = torn.get(host, 0) + 1
    if not torn:
        return what
    if len(torn) > 3:
        return f"{what}; the instances of {len(torn)} other hosts were ended by mpirun"
    named = [
        f"{host}'s {n} instances" if n > 1 else f"{host}'s instance" for host, n in torn.items()
    ]
    verb = "was" if len(named) == 1 and next(iter(torn.values())) == 1 else "were"
    return f"{what}; {' and '.join(named)} {verb} ended by mpirun"
