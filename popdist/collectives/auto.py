"""``auto``, the default backend: the first one every instance of the job can run.

Each instance probes the backends of :data:`~popdist.collectives.registry.PREFERENCE` in its
own interpreter (:meth:`BackendSpec.unavailable
<popdist.collectives.registry.BackendSpec.unavailable>`): Horovod when ``horovod.torch``
imports, else torch.distributed, which needs nothing beyond torch and mpi4py. poprun cannot
decide this for the instances: it imports neither torch nor Horovod, and the instances'
interpreter (on another host, perhaps) is not its own. Instances that started different
backends would hang in their first collective, so the probes are gathered over the MPI job
poprun started (mpi4py, as the torch backend's rendezvous does) and every instance takes the
first backend that passes on all of them (:func:`decide`, pure). Instance 0 says which, and
why, in one line on stderr.
"""

from __future__ import annotations

import sys

from popdist.collectives.errors import CollectiveError
from popdist.collectives.registry import PREFERENCE, spec
from popdist.env import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from popdist.env import RunView

__all__ = ["Choice", "choose", "decide", "gather", "probe"]

#: Why a backend that passes its probe is the one taken, when it is the first choice.
_FIRST = {"horovod": "horovod.torch imports", "torch": "torch.distributed is there"}


class Choice(Record):
    """The backend ``auto`` resolved to, and why (one short clause)."""

    __slots__ = ("name", "reason")
    name: str
    reason: str

    def __init__(self, name: str, reason: str) -> None:
        self._init(name=name, reason=reason)

    def note(self) -> str:
        """The one line instance 0 prints."""
        return f"popdist: backend auto: {self.name}, because {self.reason}"


def probe(preference: Sequence[str] = PREFERENCE) -> dict[str, str | None]:
    """This interpreter's answer for each backend: ``None`` (it runs) or why not."""
    return {name: spec(name).unavailable() for name in preference}


def decide(
    probes: Sequence[Mapping[str, str | None]], preference: Sequence[str] = PREFERENCE
) -> Choice:
    """The first backend of ``preference`` no instance's probe refused (one probe each)."""
    refused: list[str] = []
    for name in preference:
        against = [(index, p[name]) for index, p in enumerate(probes) if p.get(name) is not None]
        if not against:
            reason = "; ".join(refused) if refused else _FIRST.get(name, f"{name} is there")
            return Choice(name, reason)
        indices = ", ".join(str(index) for index, _ in against)
        where = f" on instance {indices}" if len(against) < len(probes) else ""
        refused.append(f"{against[0][1]}{where}")
    raise CollectiveError(
        f"no collectives backend runs on every instance ({'; '.join(refused)}): install "
        f"mpi4py and a torch with torch.distributed into the instances' environment"
    )


def gather(run: RunView, local: dict[str, str | None]) -> list[dict[str, str | None]]:
    """Every instance's probes, in instance order (collective over the MPI job).

    One instance, or no mpi4py to ask the others with: this instance's own (the instances of
    one poprun share an interpreter unless the hosts differ).
    """
    if run.num_instances <= 1:
        return [local]
    try:
        from mpi4py import MPI
    except ImportError:
        return [local]
    comm = MPI.COMM_WORLD
    if comm.Get_size() != run.num_instances:
        return [local]
    gathered: list[dict[str, str | None]] = comm.allgather(local)
    return gathered


def choose(run: RunView) -> Choice:
    """What ``auto`` means for this job, the same on every instance; instance 0 says it."""
    choice = decide(gather(run, probe()))
    if run.instance_index == 0:
        print(choice.note(), file=sys.stderr, flush=True)
    return choice
