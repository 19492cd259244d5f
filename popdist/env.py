"""The environment contract between ``poprun`` and the processes it launches.

This module is the single source of truth for every variable ``poprun`` exports to an
instance. ``poprun`` builds the values with :func:`instance_environment`; ``popdist``
reads them back with :func:`read_run`, through one detector per source of the description
(:class:`PoprunEnvironment`, :class:`MpirunEnvironment`, :class:`SingleProcessEnvironment`).
Nothing else in the project spells these names, and popdist_torch reads no variable
itself: the few the executor needs (:data:`POPTORCH_CACHE_DIR`, :data:`OMP_NUM_THREADS`,
the names given to ``Distributed.setEnvVarNames``) are read here too.

=========================================  ====================================================
variable                                   value
=========================================  ====================================================
``POPDIST_NUM_TOTAL_REPLICAS``             ``--num-replicas``: replicas over all instances
``POPDIST_NUM_IPUS_PER_REPLICA``           ``--ipus-per-replica``: devices of one replica
``POPDIST_NUM_LOCAL_REPLICAS``             replicas of this instance (replicas / instances,
                                           or one more on the first ``replicas % instances``)
``POPDIST_UNIFORM_REPLICAS_PER_INSTANCE``  ``1``: every instance has the same local replicas;
                                           ``0``: the split is not uniform (:func:`split_replicas`)
``POPDIST_REPLICA_INDEX_OFFSET``           global index of this instance's first replica
``POPDIST_LOCAL_INSTANCE_INDEX``           index of this instance among those on its host
``POPDIST_NUM_INSTANCES``                  ``--num-instances`` (added here; derivable too)
``POPDIST_INSTANCE_INDEX``                 this instance's index (added; derivable too)
``POPDIST_NUM_LOCAL_INSTANCES``            instances on this instance's host (added)
``POPDIST_HOST``                           the host this instance was placed on (added)
``POPDIST_OFFLINE_MODE``                   ``1`` with ``--offline-mode``: use no accelerator
``POPDIST_EXECUTABLE_CACHE_PATH``          ``--executable-cache-path``: compilation cache
``POPDIST_BACKEND``                        ``--backend``: collectives backend, ``auto`` (the
                                           default: Horovod where ``horovod.torch`` imports on
                                           every instance, else torch), ``horovod`` or
                                           ``torch`` (torch.distributed)
``POPDIST_ERROR_RECORD``                   ``1``: ``import popdist`` installs the excepthook
                                           that reports an uncaught exception to poprun as
                                           one marked stderr line (:mod:`popdist.error_record`)
``POPDIST_PROGRESS``                       the job's secret: count collectives and steps and
                                           report them to poprun (:mod:`popdist.progress`)
``POPDIST_PROGRESS_STACKS``                seconds without progress after which the progress
                                           records carry the threads' stacks (``0``: never)
``POPDIST_DETERMINISTIC_REDUCTION``        ``1`` with ``--deterministic-reduction``: the sum
                                           over replicas is the same bits whatever the split
``POPDIST_GENERATION``                     the job's membership generation (``0`` when unset);
                                           every checkpoint carries it
``POPDIST_POPTORCH_MODULES``               ``1`` with ``--poptorch-modules`` (or set by the
                                           user): ``import poptorch`` and ``import popart``
                                           answer with the project's modules (read by the
                                           ``.pth`` hook, :mod:`_popdist_poptorch`)
=========================================  ====================================================

The first six are PopRun's own. The *required* set (:data:`REQUIRED`) must be complete or
absent, and the added run variables (:data:`POPRUN_ONLY`) never come without it: a
half-set environment is an error naming the missing variable and a present one with its
value, never a silent default. When the set is absent, Open MPI's
``OMPI_COMM_WORLD_SIZE``/``OMPI_COMM_WORLD_RANK`` (both, or it is an error) and
``OMPI_COMM_WORLD_LOCAL_RANK``/``OMPI_COMM_WORLD_LOCAL_SIZE`` stand in (one replica per
process), and without those the run is a single process with one replica. A value that is
not an integer, out of range, or inconsistent with the others (an offset that is not a
multiple of the local replicas, totals that do not divide) raises :class:`PopdistError`.

A non-uniform split (``POPDIST_UNIFORM_REPLICAS_PER_INSTANCE=0``) follows one rule,
:func:`split_replicas`: the first ``replicas % instances`` instances hold one replica more,
and each instance's global replica indices are contiguous, in instance order. Every instance
can so work out every other's replicas (the data order and the deterministic reduction need
them); a split that breaks the rule is an error.

This module is stdlib-only and cheap to import: ``poprun`` and ``popdist`` both use it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (import cost)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

NUM_TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
NUM_IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
NUM_LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
UNIFORM_REPLICAS_PER_INSTANCE = "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"
REPLICA_INDEX_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
LOCAL_INSTANCE_INDEX = "POPDIST_LOCAL_INSTANCE_INDEX"
NUM_INSTANCES = "POPDIST_NUM_INSTANCES"
INSTANCE_INDEX = "POPDIST_INSTANCE_INDEX"
NUM_LOCAL_INSTANCES = "POPDIST_NUM_LOCAL_INSTANCES"
HOST = "POPDIST_HOST"
OFFLINE_MODE = "POPDIST_OFFLINE_MODE"
EXECUTABLE_CACHE_PATH = "POPDIST_EXECUTABLE_CACHE_PATH"
BACKEND = "POPDIST_BACKEND"
ERROR_RECORD = "POPDIST_ERROR_RECORD"
PROGRESS = "POPDIST_PROGRESS"
PROGRESS_STACKS = "POPDIST_PROGRESS_STACKS"
DETERMINISTIC_REDUCTION = "POPDIST_DETERMINISTIC_REDUCTION"
#: The job's membership generation: 0 at the first launch, +1 at each launch after poprun
#: left out a lost host or readmitted one (``--min-hosts``, ``--readmit``).
GENERATION = "POPDIST_GENERATION"
#: Where the instance holds its lease from poprun (``ADDRESS:PORT``; multi-host jobs):
#: without a renewal for a while, the instance ends itself (:mod:`popdist.lease`).
LEASE = "POPDIST_LEASE"
#: The opt-in PopTorch module names (``poprun --poptorch-modules``); the user may set it too,
#: and poprun passes it on (:data:`USER_TUNING`). The site-packages hook reads the same name
#: (``_popdist_poptorch.VARIABLE``).
POPTORCH_MODULES = "POPDIST_POPTORCH_MODULES"

#: The values ``POPDIST_BACKEND`` (``poprun --backend``) may take; the first is the default.
BACKENDS: tuple[str, ...] = ("auto", "horovod", "torch")

#: PopRun's variables: all present under poprun, all absent otherwise.
REQUIRED: tuple[str, ...] = (
    NUM_TOTAL_REPLICAS,
    NUM_IPUS_PER_REPLICA,
    NUM_LOCAL_REPLICAS,
    UNIFORM_REPLICAS_PER_INSTANCE,
    REPLICA_INDEX_OFFSET,
    LOCAL_INSTANCE_INDEX,
)
#: Added variables poprun always sets with :data:`REQUIRED`: alone they are a half-set
#: environment too. (``HOST``, ``OFFLINE_MODE``, ``EXECUTABLE_CACHE_PATH``, ``BACKEND`` and
#: ``ERROR_RECORD`` may stand alone, as may ``PROGRESS`` and ``PROGRESS_STACKS``.)
POPRUN_ONLY: tuple[str, ...] = (NUM_INSTANCES, INSTANCE_INDEX, NUM_LOCAL_INSTANCES)
#: Every variable of the contract, in the order of the table above.
ALL: tuple[str, ...] = (
    *REQUIRED,
    NUM_INSTANCES,
    INSTANCE_INDEX,
    NUM_LOCAL_INSTANCES,
    HOST,
    OFFLINE_MODE,
    EXECUTABLE_CACHE_PATH,
    BACKEND,
    ERROR_RECORD,
    PROGRESS,
    PROGRESS_STACKS,
    DETERMINISTIC_REDUCTION,
    GENERATION,
    LEASE,
)

OMPI_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
OMPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"


def reported_as(environ: Mapping[str, str]) -> tuple[int | None, str]:
    """How an instance names itself in what it sends poprun (error and progress records):
    its index (poprun's, else mpirun's rank; ``None`` when neither reads as a number) and
    its host (poprun's name for it, else this machine's)."""
    index = environ.get(INSTANCE_INDEX) or environ.get(OMPI_RANK) or "0"
    number = int(index) if index.strip().isdigit() else None
    return number, environ.get(HOST) or os.uname().nodename


class PopdistError(RuntimeError):
    """A popdist environment or call that cannot be honoured.

    Subclass of :class:`RuntimeError`; the message names the variable or argument, its
    value, what was expected and what to do.
    """


class Record:
    """A small immutable record: equality, hash, repr and ``as_dict`` over ``__slots__``.

    Used instead of a frozen dataclass because ``import dataclasses`` costs more than the
    rest of ``import popdist`` together.
    """

    __slots__: tuple[str, ...] = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot delete {name!r}")

    def _init(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def as_dict(self) -> dict[str, Any]:
        """The fields, by name, in declaration order."""
        return {name: getattr(self, name) for name in self.__slots__}

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes`` applied."""
        return type(self)(**{**self.as_dict(), **changes})

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"


class RunView(Record):
    """One process's view of the run, as the environment describes it."""

    __slots__ = (  # noqa: RUF023 - declaration order is the field order
        "num_total_replicas",
        "num_ipus_per_replica",
        "num_local_replicas",
        "replica_index_offset",
        "local_instance_index",
        "num_instances",
        "instance_index",
        "num_local_instances",
        "host",
        "offline_mode",
        "executable_cache_path",
        "from_poprun",
        "uniform",
    )
    num_total_replicas: int
    num_ipus_per_replica: int
    num_local_replicas: int
    replica_index_offset: int
    local_instance_index: int
    num_instances: int
    instance_index: int
    num_local_instances: int
    host: str
    offline_mode: bool
    executable_cache_path: str | None
    from_poprun: bool
    uniform: bool

    def __init__(
        self,
        num_total_replicas: int = 1,
        num_ipus_per_replica: int = 1,
        num_local_replicas: int = 1,
        replica_index_offset: int = 0,
        local_instance_index: int = 0,
        num_instances: int = 1,
        instance_index: int = 0,
        num_local_instances: int = 1,
        host: str = "",
        offline_mode: bool = False,
        executable_cache_path: str | None = None,
        from_poprun: bool = False,
        uniform: bool = True,
    ) -> None:
        self._init(
            num_total_replicas=num_total_replicas,
            num_ipus_per_replica=num_ipus_per_replica,
            num_local_replicas=num_local_replicas,
            replica_index_offset=replica_index_offset,
            local_instance_index=local_instance_index,
            num_instances=num_instances,
            instance_index=instance_index,
            num_local_instances=num_local_instances,
            host=host,
            offline_mode=offline_mode,
            executable_cache_path=executable_cache_path,
            from_poprun=from_poprun,
            uniform=uniform,
        )

    def replica_counts(self) -> tuple[int, ...]:
        """Every instance's local replicas, in instance order (they sum to the total)."""
        if self.uniform:
            return (self.num_local_replicas,) * self.num_instances
        return split_replicas(self.num_total_replicas, self.num_instances)


def split_replicas(num_total_replicas: int, num_instances: int) -> tuple[int, ...]:
    """Each instance's local replicas: the first ``total % instances`` hold one more.

    The one rule of a non-uniform split; global replica indices are contiguous in instance
    order, so instance ``i``'s first replica is the sum of the counts before it.
    """
    if num_instances < 1 or num_total_replicas < num_instances:
        raise PopdistError(
            f"num_total_replicas={num_total_replicas} must be at least num_instances="
            f"{num_instances} >= 1: every instance needs a replica"
        )
    base, extra = divmod(num_total_replicas, num_instances)
    return tuple(base + (i < extra) for i in range(num_instances))


def replica_share(num_total_replicas: int, num_instances: int, index: int) -> tuple[int, int]:
    """Instance ``index``'s ``(local replicas, first global replica)`` under
    :func:`split_replicas`, in constant time: what one instance derives from its rank (poprun's
    instance wrapper does the same arithmetic, :mod:`poprun.plan.compact`)."""
    if not 0 <= index < num_instances <= num_total_replicas:
        raise PopdistError(
            f"instance {index} of num_instances={num_instances} with num_total_replicas="
            f"{num_total_replicas}: expected an index below the count, and at least one "
            f"replica per instance"
        )
    base, extra = divmod(num_total_replicas, num_instances)
    return base + (index < extra), index * base + min(index, extra)


def instance_environment(
    *,
    num_total_replicas: int,
    num_ipus_per_replica: int,
    num_instances: int,
    instance_index: int,
    local_instance_index: int,
    num_local_instances: int,
    host: str,
    offline_mode: bool = False,
    executable_cache_path: str | None = None,
    num_local_replicas: int | None = None,
    replica_index_offset: int | None = None,
) -> dict[str, str]:
    """The variables ``poprun`` exports to one instance, in the table's order.

    Without ``num_local_replicas``/``replica_index_offset`` the replicas must divide evenly
    over the instances. With them (poprun's planner after a host is lost) the split may be
    non-uniform, and must then follow :func:`split_replicas`;
    ``POPDIST_UNIFORM_REPLICAS_PER_INSTANCE`` is the job-level fact (``0`` when ``total``
    does not divide by ``instances``).
    """
    if num_instances < 1 or num_total_replicas < 1:
        raise PopdistError(
            f"num_total_replicas={num_total_replicas} and num_instances={num_instances} "
            f"must be positive"
        )
    if not 0 <= instance_index < num_instances:
        raise PopdistError(f"instance_index={instance_index} must be in [0, {num_instances})")
    local, offset = _instance_replicas(
        num_total_replicas, num_instances, instance_index, num_local_replicas, replica_index_offset
    )
    uniform = num_total_replicas % num_instances == 0
    env = {
        NUM_TOTAL_REPLICAS: str(num_total_replicas),
        NUM_IPUS_PER_REPLICA: str(num_ipus_per_replica),
        NUM_LOCAL_REPLICAS: str(local),
        UNIFORM_REPLICAS_PER_INSTANCE: "1" if uniform else "0",
        REPLICA_INDEX_OFFSET: str(offset),
        LOCAL_INSTANCE_INDEX: str(local_instance_index),
        NUM_INSTANCES: str(num_instances),
        INSTANCE_INDEX: str(instance_index),
        NUM_LOCAL_INSTANCES: str(num_local_instances),
        HOST: host,
    }
    if offline_mode:
        env[OFFLINE_MODE] = "1"
    if executable_cache_path:
        env[EXECUTABLE_CACHE_PATH] = executable_cache_path
    return env


def _instance_replicas(
    total: int, instances: int, index: int, local: int | None, offset: int | None
) -> tuple[int, int]:
    """``(local replicas, offset)`` of instance ``index``: even, or as given on the rule."""
    if local is None and offset is None:
        if total % instances:
            raise PopdistError(
                f"num_total_replicas={total} must be a positive multiple of "
                f"num_instances={instances} (or give num_local_replicas and "
                f"replica_index_offset for a non-uniform split)"
            )
        return total // instances, index * (total // instances)
    want = replica_share(total, instances, index)
    if (local, offset) != want:
        counts = split_replicas(total, instances)
        raise PopdistError(
            f"num_local_replicas={local}, replica_index_offset={offset} for instance {index} "
            f"of {instances}: {total} replicas split as {counts} give {want[0]} from {want[1]}"
        )
    return want


def _int(environ: Mapping[str, str], name: str, *, minimum: int) -> int:
    raw = environ[name]
    try:
        value = int(raw.strip())
    except ValueError:
        raise PopdistError(
            f"{name}={raw!r} is not an integer: the launcher sets it, so relaunch with poprun "
            f"(or mpirun), or unset it to run alone"
        ) from None
    if value < minimum:
        raise PopdistError(
            f"{name}={raw!r} must be at least {minimum}: relaunch with poprun (or mpirun), "
            f"or unset it to run alone"
        )
    return value


def _flag(environ: Mapping[str, str], name: str) -> bool:
    raw = environ.get(name, "")
    value = raw.strip().lower()
    if value in {"", "0", "false", "no", "off"}:
        return False
    if value in {"1", "true", "yes", "on"}:
        return True
    raise PopdistError(f"{name}={raw!r} is not a flag: expected 1 or 0")


def _stand_alone(environ: Mapping[str, str]) -> dict[str, Any]:
    """The variables that may stand alone, whoever launched the process."""
    return {
        "offline_mode": _flag(environ, OFFLINE_MODE),
        "executable_cache_path": environ.get(EXECUTABLE_CACHE_PATH) or None,
    }


class RunEnvironment:
    """One source of the run's description (Lightning's cluster environments are the model).

    :meth:`detect` says whether this source describes the process; :meth:`read` builds the
    :class:`RunView` from it, or raises :class:`PopdistError` when it is malformed.
    :data:`DETECTORS` lists the sources, the first that detects wins.
    """

    #: How messages and logs name the source.
    name = ""

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        """Whether this source describes the process."""
        raise NotImplementedError

    @staticmethod
    def read(environ: Mapping[str, str]) -> RunView:
        """This process's :class:`RunView` from this source."""
        raise NotImplementedError


class PoprunEnvironment(RunEnvironment):
    """poprun's ``POPDIST_*`` set: complete, or any of it present is a half-set error."""

    name = "poprun"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return any(name in environ for name in (*REQUIRED, *POPRUN_ONLY))

    @staticmethod
    def read(environ: Mapping[str, str]) -> RunView:
        missing = [name for name in REQUIRED if name not in environ]
        if missing:
            present = next(name for name in (*REQUIRED, *POPRUN_ONLY) if name in environ)
            raise PopdistError(
                f"{missing[0]} is not set but {present}={environ[present]!r} is: the POPDIST_* "
                f"environment is half set; launch with poprun, or unset every POPDIST_* "
                f"variable to run alone"
            )
        replicas = PoprunEnvironment._replicas(environ)
        return RunView(
            **replicas,
            **PoprunEnvironment._instances(environ, replicas),
            host=environ.get(HOST, ""),
            **_stand_alone(environ),
            from_poprun=True,
        )

    @staticmethod
    def _replicas(environ: Mapping[str, str]) -> dict[str, Any]:
        """PopRun's own replica variables, checked against one another."""
        total = _int(environ, NUM_TOTAL_REPLICAS, minimum=1)
        ipr = _int(environ, NUM_IPUS_PER_REPLICA, minimum=1)
        local = _int(environ, NUM_LOCAL_REPLICAS, minimum=1)
        offset = _int(environ, REPLICA_INDEX_OFFSET, minimum=0)
        uniform = environ[UNIFORM_REPLICAS_PER_INSTANCE].strip()
        if uniform not in {"0", "1"}:
            raise PopdistError(
                f"{UNIFORM_REPLICAS_PER_INSTANCE}={uniform!r} must be 1 (every instance holds "
                f"the same replicas) or 0 (a non-uniform split); relaunch with poprun"
            )
        if uniform == "1":
            if total % local:
                raise PopdistError(
                    f"{NUM_TOTAL_REPLICAS}={total} is not a multiple of {NUM_LOCAL_REPLICAS}="
                    f"{local}; with {UNIFORM_REPLICAS_PER_INSTANCE}=1 every instance must own "
                    f"the same number of replicas"
                )
            if offset % local or offset >= total:
                raise PopdistError(
                    f"{REPLICA_INDEX_OFFSET}={offset} must be a multiple of "
                    f"{NUM_LOCAL_REPLICAS}={local} below {NUM_TOTAL_REPLICAS}={total}"
                )
        return {
            "num_total_replicas": total,
            "num_ipus_per_replica": ipr,
            "num_local_replicas": local,
            "replica_index_offset": offset,
            "uniform": uniform == "1",
        }

    @staticmethod
    def _instances(environ: Mapping[str, str], replicas: dict[str, Any]) -> dict[str, Any]:
        """The instance numbers: derived from the replicas, the added variables must agree.

        A non-uniform split cannot be derived: its instance count and index are read, and the
        replicas must be this instance's share under :func:`split_replicas`.
        """
        local = replicas["num_local_replicas"]
        if replicas["uniform"]:
            num_instances = replicas["num_total_replicas"] // local
            instance_index = replicas["replica_index_offset"] // local
        else:
            num_instances, instance_index = PoprunEnvironment._non_uniform(environ, replicas)
        for name, derived, minimum in (
            (NUM_INSTANCES, num_instances, 1),
            (INSTANCE_INDEX, instance_index, 0),
        ):
            if name in environ and _int(environ, name, minimum=minimum) != derived:
                raise PopdistError(
                    f"{name}={environ[name]!r} disagrees with the replica variables, which "
                    f"give {derived}; relaunch with poprun"
                )
        local_index = _int(environ, LOCAL_INSTANCE_INDEX, minimum=0)
        num_local_instances = 1
        if NUM_LOCAL_INSTANCES in environ:
            num_local_instances = _int(environ, NUM_LOCAL_INSTANCES, minimum=1)
            if local_index >= num_local_instances:
                raise PopdistError(
                    f"{LOCAL_INSTANCE_INDEX}={local_index} must be below "
                    f"{NUM_LOCAL_INSTANCES}={num_local_instances}"
                )
        return {
            "local_instance_index": local_index,
            "num_instances": num_instances,
            "instance_index": instance_index,
            "num_local_instances": num_local_instances,
        }

    @staticmethod
    def _non_uniform(environ: Mapping[str, str], replicas: dict[str, Any]) -> tuple[int, int]:
        """``(instances, index)`` of a non-uniform split, checked against its rule."""
        for name in (NUM_INSTANCES, INSTANCE_INDEX):
            if name not in environ:
                raise PopdistError(
                    f"{name} is not set but {UNIFORM_REPLICAS_PER_INSTANCE}=0 is: a non-uniform "
                    f"split needs the instance count and index; relaunch with poprun"
                )
        num_instances = _int(environ, NUM_INSTANCES, minimum=1)
        index = _int(environ, INSTANCE_INDEX, minimum=0)
        total = replicas["num_total_replicas"]
        if index >= num_instances or total < num_instances:
            raise PopdistError(
                f"{INSTANCE_INDEX}={index} of {NUM_INSTANCES}={num_instances} with "
                f"{NUM_TOTAL_REPLICAS}={total}: expected an index below the count, and at "
                f"least one replica per instance; relaunch with poprun"
            )
        want = replica_share(total, num_instances, index)
        got = (replicas["num_local_replicas"], replicas["replica_index_offset"])
        if got != want:
            counts = split_replicas(total, num_instances)
            raise PopdistError(
                f"{NUM_LOCAL_REPLICAS}={got[0]}, {REPLICA_INDEX_OFFSET}={got[1]} on instance "
                f"{index}: {total} replicas over {num_instances} instances split as "
                f"{list(counts)} (the first {total % num_instances} hold one more), which "
                f"gives {want[0]} from {want[1]}; relaunch with poprun"
            )
        return num_instances, index


class MpirunEnvironment(RunEnvironment):
    """A plain ``mpirun``: Open MPI's ``OMPI_COMM_WORLD_*``, one replica per process."""

    name = "mpirun"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return OMPI_SIZE in environ or OMPI_RANK in environ

    @staticmethod
    def read(environ: Mapping[str, str]) -> RunView:
        for name, other in ((OMPI_SIZE, OMPI_RANK), (OMPI_RANK, OMPI_SIZE)):
            if name not in environ:
                raise PopdistError(
                    f"{name} is not set but {other}={environ[other]!r} is: Open MPI sets both; "
                    f"launch with poprun or mpirun, or unset OMPI_COMM_WORLD_* to run alone"
                )
        size = _int(environ, OMPI_SIZE, minimum=1)
        rank = _int(environ, OMPI_RANK, minimum=0)
        if rank >= size:
            raise PopdistError(f"{OMPI_RANK}={rank} must be below {OMPI_SIZE}={size}")
        local_rank = _int(environ, OMPI_LOCAL_RANK, minimum=0) if OMPI_LOCAL_RANK in environ else 0
        local_size = 1
        if OMPI_LOCAL_SIZE in environ:
            local_size = _int(environ, OMPI_LOCAL_SIZE, minimum=1)
            if local_rank >= local_size:
                raise PopdistError(
                    f"{OMPI_LOCAL_RANK}={local_rank} must be below {OMPI_LOCAL_SIZE}={local_size}"
                )
        return RunView(
            num_total_replicas=size,
            num_local_replicas=1,
            replica_index_offset=rank,
            local_instance_index=local_rank,
            num_instances=size,
            instance_index=rank,
            num_local_instances=local_size,
            **_stand_alone(environ),
            from_poprun=False,
        )


class SingleProcessEnvironment(RunEnvironment):
    """No launcher: one instance with one replica (always detects; it comes last)."""

    name = "single process"

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return True

    @staticmethod
    def read(environ: Mapping[str, str]) -> RunView:
        return RunView(**_stand_alone(environ))


#: The sources of the run's description, in order: the first that detects wins.
DETECTORS: tuple[type[RunEnvironment], ...] = (
    PoprunEnvironment,
    MpirunEnvironment,
    SingleProcessEnvironment,
)


def detect(environ: Mapping[str, str] | None = None) -> type[RunEnvironment]:
    """The source that describes this process (from ``environ``, default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    return next(source for source in DETECTORS if source.detect(environ))


def read_backend(environ: Mapping[str, str] | None = None, requested: str | None = None) -> str:
    """The collective backend: ``requested`` if given, else ``POPDIST_BACKEND``, else ``auto``.

    Raises :class:`PopdistError` for a name that is not one of :data:`BACKENDS`.
    """
    environ = os.environ if environ is None else environ
    if requested is not None:
        source, raw = "popdist.init(backend=...)", requested
    else:
        source, raw = BACKEND, environ.get(BACKEND, "")
    name = raw.strip().lower() or BACKENDS[0]
    if name not in BACKENDS:
        raise PopdistError(
            f"{source}={raw!r} is not a collective backend: expected one of "
            f"{', '.join(BACKENDS)} (poprun --backend sets it)"
        )
    return name


def read_run(environ: Mapping[str, str] | None = None) -> RunView:
    """Read this process's :class:`RunView` from ``environ`` (default: ``os.environ``).

    Raises :class:`PopdistError` for a half-set or malformed environment.
    """
    environ = os.environ if environ is None else environ
    return detect(environ).read(environ)


# -- what the executor needs from the environment ---------------------------------------------
# popdist_torch reads the process's environment only through these, so that every variable
# the project reads is read in this module.

#: PopTorch's executable cache directory; it wins over poprun's ``--executable-cache-path``.
POPTORCH_CACHE_DIR = "POPTORCH_CACHE_DIR"
#: The user's choice of intra-op threads (torch reads it at start-up).
OMP_NUM_THREADS = "OMP_NUM_THREADS"
#: Seconds the torch backend waits for the other instances (start-up and each collective).
TORCH_TIMEOUT = "POPDIST_TORCH_TIMEOUT"
#: ... when ``POPDIST_TORCH_TIMEOUT`` is unset (torch's own default is 30 minutes).
DEFAULT_TORCH_TIMEOUT_S = 600.0
#: How the torch backend reduces CPU gradients: ``mpi`` (the default) or ``gloo``.
TORCH_CPU_ALLREDUCE = "POPDIST_TORCH_CPU_ALLREDUCE"
TORCH_CPU_ALLREDUCE_CHOICES = ("mpi", "gloo")
#: ``0`` turns off the executor's CUDA graph of the training micro-step (set by the user).
CUDA_GRAPHS = "POPDIST_CUDA_GRAPHS"
#: The ``POPDIST_*`` variables the *user* sets (tuning, not the run's shape): poprun passes
#: them to the instances as they are, where it replaces every other ``POPDIST_*``.
USER_TUNING = frozenset({TORCH_TIMEOUT, TORCH_CPU_ALLREDUCE, POPTORCH_MODULES, CUDA_GRAPHS})


def read_process(
    var_num_processes: str, var_process_id: str, environ: Mapping[str, str] | None = None
) -> tuple[int, int]:
    """``(process id, process count)`` from two variables the user names (PopTorch's
    ``Distributed.setEnvVarNames``); an unset one means id 0, count 1."""
    environ = os.environ if environ is None else environ
    values: list[int] = []
    for name, default in ((var_process_id, "0"), (var_num_processes, "1")):
        raw = environ.get(name, default)
        try:
            values.append(int(raw))
        except ValueError:
            raise PopdistError(
                f"{name}={raw!r} is not an integer; fix or unset it (Options.Distributed "
                f"reads the process id and count from it)"
            ) from None
    return values[0], values[1]


def read_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The executable cache: ``POPTORCH_CACHE_DIR``, else poprun's path, else ``None``."""
    environ = os.environ if environ is None else environ
    return environ.get(POPTORCH_CACHE_DIR) or read_run(environ).executable_cache_path


def read_compute_threads(
    environ: Mapping[str, str] | None = None, *, deterministic: bool = False
) -> int | None:
    """Intra-op threads for one of several instances on a host: cores / local instances.

    ``None`` when the user chose (``OMP_NUM_THREADS``) or the instance is alone on its host.
    ``deterministic`` (the deterministic reduction): 1 unless the user chose, since a count
    that follows the split could change a CPU reduction's bits.
    """
    environ = os.environ if environ is None else environ
    if environ.get(OMP_NUM_THREADS):
        return None
    if deterministic:
        return 1
    local = read_run(environ).num_local_instances
    if local <= 1:
        return None
    return max(1, local_cores() // local)


def local_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_outnumber_cores(local_instances: int, cores: int) -> bool:
    """Whether a host's instances have more busy threads than ``cores``: each instance its
    compute thread and Horovod's background thread. poprun sets ``mpi_yield_when_idle`` by
    it, and the Horovod backend then blocks in its waits at once."""
    return 2 * local_instances > cores


def read_torch_cpu_allreduce(environ: Mapping[str, str] | None = None) -> str:
    """``POPDIST_TORCH_CPU_ALLREDUCE`` (set by the user): ``mpi`` (default) or ``gloo``."""
    environ = os.environ if environ is None else environ
    raw = environ.get(TORCH_CPU_ALLREDUCE, "").strip()
    if not raw:
        return TORCH_CPU_ALLREDUCE_CHOICES[0]
    if raw.lower() not in TORCH_CPU_ALLREDUCE_CHOICES:
        raise PopdistError(
            f"{TORCH_CPU_ALLREDUCE}={raw!r} must be one of "
            f"{', '.join(TORCH_CPU_ALLREDUCE_CHOICES)}; unset it for the default (mpi)"
        )
    return raw.lower()


def read_torch_timeout(environ: Mapping[str, str] | None = None) -> float:
    """``POPDIST_TORCH_TIMEOUT`` in seconds (set by the user), else the default (600)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(TORCH_TIMEOUT, "")
    if not raw.strip():
        return DEFAULT_TORCH_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise PopdistError(
            f"{TORCH_TIMEOUT}={raw!r} must be a positive number of seconds; unset it for the "
            f"default ({DEFAULT_TORCH_TIMEOUT_S:g})"
        )
    return value


def read_deterministic_reduction(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``poprun --deterministic-reduction`` asked for the split-independent sum."""
    environ = os.environ if environ is None else environ
    return _flag(environ, DETERMINISTIC_REDUCTION)


def read_poptorch_modules(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the process asked for the PopTorch module names (``POPDIST_POPTORCH_MODULES``):
    the program then runs as if on IPUs (``poptorch.ipuHardwareVersion()`` answers)."""
    environ = os.environ if environ is None else environ
    return _flag(environ, POPTORCH_MODULES)


def read_cuda_graphs(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the executor may capture its training micro-step in a CUDA graph: yes unless
    ``POPDIST_CUDA_GRAPHS`` is ``0`` (or another false flag)."""
    environ = os.environ if environ is None else environ
    return not environ.get(CUDA_GRAPHS, "").strip() or _flag(environ, CUDA_GRAPHS)


def generation(environ: Mapping[str, str] | None = None) -> int:
    """The job's membership generation, ``POPDIST_GENERATION`` (0 when unset).

    poprun raises it each time it relaunches the job on other hosts; a checkpoint records it,
    and a write from an older generation than its directory holds is refused.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(GENERATION, "")
    if not raw.strip():
        return 0
    return _int(environ, GENERATION, minimum=0)


def read_host(environ: Mapping[str, str] | None = None) -> str:
    """This instance's host: poprun's name for it (``POPDIST_HOST``), else this machine's."""
    return reported_as(os.environ if environ is None else environ)[1]
