"""Which instance failed first (pure): from what happened, not from the order it arrived in.

When one instance of a job across hosts dies, mpirun ends the others, and the records of
both reach poprun by different roads: each remote instance's end through its own host's
Open MPI daemon, mpirun's report through mpirun. The killed instance's record may arrive
after those of the instances mpirun then ended, so the order of arrival names nobody. What
does:

- **How each instance ended.** mpirun's teardown sends SIGTERM (:data:`TEARDOWN`; SIGKILL
  follows only for a process still there ``odls_base_sigkill_timeout``, 1 s, later, and an
  instance ends at the SIGTERM). Any other signal, SIGKILL among them, is taken as not
  mpirun's doing. (:attr:`poprun.run.evidence.ExitRecord.ended_by_the_job` counts SIGKILL
  with the teardown: it picks a record that is certainly a failure, not who came first.) A
  program that traps SIGTERM and lingers past that second is then "killed", and its end
  time, after the first failure's, makes the evidence disagree rather than blame its host.
- **mpirun's own report** (its box: "process rank 2 ... exited on signal 9"): the first
  end its daemons told it of, the one that set the teardown off.
- **Open MPI's peer report** ("An MPI communication peer process has unexpectedly
  disconnected ... Peer host: h3"): a live process saw that host's process vanish. Open MPI
  prints the first such report whole and only counts the rest, so the first is the one.
- **When each instance ended**, by its wrapper's clock: an end earlier than every other
  host's failed ends by more than :data:`CLOCK_SLACK_S` (hosts' clocks differ a little)
  happened first.

Each of these that names someone names a host. When those that name one agree, that host
holds the first failure (:func:`first_failure`); when none names a host, or they disagree,
nobody is named and :attr:`FirstFailure.why_not` says why. The end times alone name a host
only when that end is an own signal too, and an earliest end by the teardown's SIGTERM only
ever confirms a host named otherwise: a SIGTERM that merely came first by the clocks may be
the teardown of a job whose first failure has no time (on the launch host, whose instances
poprun sees end only by their pids, or a record that never arrived), and the teardown
reaches the other hosts in no particular order.

The ends are those of the instances on other hosts (their wrappers' records). A host named
here is not yet lost: :meth:`poprun.run.membership.members.Membership.blame` decides that.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from typing import NamedTuple

#: The signal mpirun's teardown sends each instance when it ends a job.
TEARDOWN = frozenset({signal.SIGTERM})
#: Two ends on different hosts' clocks this close are taken as simultaneous.
CLOCK_SLACK_S = 0.05

#: What each kind of evidence is called in the report.
MPIRUN, SIGNALS, PEER, TIMES = (
    "mpirun's report",
    "the signals",
    "Open MPI's peer report",
    "the end times",
)


class End(NamedTuple):
    """How one instance of the attempt ended, as far as poprun knows."""

    instance: int
    host: str
    #: ``Popen`` style: the exit code, or ``-N`` for signal N.
    returncode: int
    #: When its wrapper saw it end (wall-clock seconds on its host), if known.
    at: float | None = None

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    @property
    def own_signal(self) -> bool:
        """Killed by a signal mpirun's teardown does not send: not mpirun's doing."""
        return self.returncode < 0 and -self.returncode not in TEARDOWN

    @property
    def by_teardown(self) -> bool:
        """Ended by the signal mpirun's teardown sends (it may also be the first failure)."""
        return self.returncode < 0 and -self.returncode in TEARDOWN

    def how(self) -> str:
        """``killed by SIGKILL``, ``ended by SIGTERM``, ``exited with code 3``."""
        rc = self.returncode
        if rc < 0:
            return f"{'ended' if -rc in TEARDOWN else 'killed'} by {signal_name(-rc)}"
        return f"exited with code {rc}"


class FirstFailure(NamedTuple):
    """The first failure and the evidence that names it, or why nobody is named."""

    host: str | None = None
    #: The instance of :attr:`host` that failed first, when one can be told.
    instance: int | None = None
    #: The kinds of evidence that named :attr:`host` (:data:`MPIRUN`, ...).
    by: tuple[str, ...] = ()
    why_not: str = ""


def first_failure(
    ends: Sequence[End],
    placement: Mapping[int, str],
    *,
    mpirun_first: int | None = None,
    peers: Sequence[str] = (),
) -> FirstFailure:
    """The host (and instance) of the first failure among ``ends``.

    ``mpirun_first``: the instance mpirun's report names; ``peers``: the hosts Open MPI's
    peer reports name, in the order they came (host names as Open MPI prints them: matched
    to ``placement``'s by the whole name or its first label).
    """
    failed = [end for end in ends if end.failed]
    named: dict[str, list[str]] = {}  # host -> the evidence naming it
    if mpirun_first is not None and mpirun_first in placement:
        named.setdefault(placement[mpirun_first], []).append(MPIRUN)
    own_hosts = {end.host for end in failed if end.own_signal}
    if len(own_hosts) == 1:
        named.setdefault(next(iter(own_hosts)), []).append(SIGNALS)
    peer = _match(peers[0], set(placement.values())) if peers else None
    if peer is not None:
        named.setdefault(peer, []).append(PEER)
    earliest = _earliest(failed)
    if earliest is not None and (
        earliest.own_signal
        or earliest.host in named
        or (named and not earliest.by_teardown)  # an exit code before the rest: it counts
    ):
        named.setdefault(earliest.host, []).append(TIMES)
    if not named:
        how = ", ".join(sorted({end.how() for end in failed})) or "nothing"
        return FirstFailure(why_not=f"the instances' ends ({how}) do not tell which came first")
    if len(named) > 1:
        said = "; ".join(f"{' and '.join(by)}: {host}" for host, by in named.items())
        return FirstFailure(why_not=f"the evidence disagrees on which host failed first ({said})")
    [(host, by)] = named.items()
    return FirstFailure(host, _first_on(host, failed, mpirun_first, placement), tuple(by))


def _earliest(failed: Sequence[End]) -> End | None:
    """The failed end earlier than every other failed end on another host by more than
    :data:`CLOCK_SLACK_S` (None: no such end, or fewer than two hosts' times to compare)."""
    timed = sorted((end for end in failed if end.at is not None), key=lambda end: end.at or 0.0)
    if not timed:
        return None
    first = timed[0]
    others = [end for end in timed if end.host != first.host]
    if not others or (others[0].at or 0.0) - (first.at or 0.0) <= CLOCK_SLACK_S:
        return None
    return first


def _first_on(
    host: str, failed: Sequence[End], mpirun_first: int | None, placement: Mapping[int, str]
) -> int | None:
    """Which of ``host``'s instances failed first: mpirun's, else the earliest, else the one
    killed by its own signal, else the first record."""
    if mpirun_first is not None and placement.get(mpirun_first) == host:
        return mpirun_first
    on_host = [end for end in failed if end.host == host]
    timed = [end for end in on_host if end.at is not None]
    if timed:
        return min(timed, key=lambda end: end.at or 0.0).instance
    own = [end for end in on_host if end.own_signal]
    chosen = own or on_host
    return chosen[0].instance if chosen else None


def _match(name: str, hosts: set[str]) -> str | None:
    """The job's host that Open MPI's name for it stands for (its whole name or first label)."""
    if name in hosts:
        return name
    if name.replace(".", "").isdigit() or ":" in name:
        return None  # an address: its first "label" names no host
    label = name.split(".", 1)[0]
    matches = [host for host in hosts if host.split(".", 1)[0] == label]
    return matches[0] if len(matches) == 1 else None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
