"""Where a run's hosts come from, and which of them is this machine.

A :class:`HostSource` gives the run its host names: :class:`HostList` (``-H a,b``, ranges
``node[0-2,4]``), :class:`HostFile` (``--host-file``: poprun's format, a host or range a
line, or Open MPI's, with ``slots=``; ``#`` comments), :class:`JobHosts` (an engine's job:
Slurm, Grid Engine, LSF, PBS, a Kubernetes launcher's host file, Volcano's ``MPI_HOST``,
read by :mod:`poprun.plan.engines`) and :class:`WithinAllocation` (hosts named inside a
job, checked against it), chosen in :func:`host_source`: the options first, then the job. A
source also places the instances (:meth:`HostSource.place`): listed hosts share them evenly,
slots fill the hosts in order. An engine is one more reader, not one more source. A
source's errors are usage errors (:class:`~poprun.errors.PoprunError`): the configuration
reads it before anything launches.
"""

from __future__ import annotations

import functools
import re
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from poprun.config.user_files import read_user_file
from poprun.errors import PoprunError
from poprun.plan.engines import hostfile
from poprun.plan.engines.allocation import Allocation, JobAllocation, check_hosts, place
from poprun.plan.engines.hostfile import FileHosts

if TYPE_CHECKING:
    import ipaddress

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
#: mpirun's words for "more instances than slots" (in ``--mpi-global-args``).
_OVERSUBSCRIBE = frozenset({"--oversubscribe", "-oversubscribe"})
#: The most hosts one job may list (ranges included): more is a typo, not a cluster.
MAX_HOSTS = 65536


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets: ``a[0-1,3],b`` → ``['a[0-1,3]', 'b']``."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _expand(item: str, option: str, room: int = MAX_HOSTS) -> list[str]:
    """The host names ``item`` stands for; at most ``room`` of them, else an error."""
    fix = "write hosts as name or prefix[0-3,5] with ascending ranges, e.g. -H node[0-1],gpu7"
    match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]*)\]([^\[\]]*)", item)
    if match is None:
        if "[" in item or "]" in item:
            raise PoprunError(option, item, "unbalanced or nested brackets in the host range", fix)
        if not _NAME.match(item):
            raise PoprunError(
                option,
                item,
                "not a host name (letters, digits, '.', '-', '_'; poprun computes slots itself)",
                fix,
            )
        if room < 1:
            raise PoprunError(
                option,
                item,
                f"is one host more than {MAX_HOSTS}",
                f"list at most {MAX_HOSTS} hosts",
            )
        return [item]
    prefix, ranges, suffix = match.groups()
    bounds: list[tuple[int, int, int]] = []
    count = 0
    for part in ranges.split(","):
        rng = _RANGE.match(part.strip())
        if rng is None:
            raise PoprunError(option, item, f"range part {part!r} is not N or N-M", fix)
        first, last = rng.group(1), rng.group(2) or rng.group(1)
        if len(first) > 9 or len(last) > 9:
            raise PoprunError(option, item, "a range bound has more than 9 digits", fix)
        if int(last) < int(first):
            raise PoprunError(option, item, f"range {part} runs backwards", fix)
        width = len(first) if first.startswith("0") and len(first) > 1 else 0
        bounds.append((int(first), int(last), width))
        count += int(last) - int(first) + 1
        if count > room:  # counted before anything is built: node[0-99999999] is one check
            raise PoprunError(
                option,
                item,
                f"stands for more than {MAX_HOSTS} hosts in all",
                "check the range bounds (a typo adds digits); one job lists at most "
                f"{MAX_HOSTS} hosts",
            )
    hosts: list[str] = []
    for first_n, last_n, width in bounds:
        hosts.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(first_n, last_n + 1))
    for host in hosts:
        if not _NAME.match(host):
            raise PoprunError(option, item, f"{host!r} is not a valid host name", fix)
    return hosts


def parse_host_list(values: list[str] | tuple[str, ...], option: str = "--host") -> tuple[str, ...]:
    """Expand every ``-H`` value into host names, refusing empty entries and duplicates."""
    hosts: list[str] = []
    for value in values:
        for item in _split_top_level(value.strip()):
            item = item.strip()
            if not item:
                raise PoprunError(
                    option, value, "empty host name in the list", "remove the extra comma"
                )
            hosts.extend(_expand(item, option, MAX_HOSTS - len(hosts)))
    _refuse_duplicates(hosts, option)
    return tuple(hosts)


def read_host_file(path: str, option: str = "--host-file") -> FileHosts:
    """A host file in poprun's format (a host or range a line) or Open MPI's (``slots=``),
    read and checked (:mod:`poprun.plan.engines.hostfile`)."""
    text = read_user_file(option, path, "host file (one host a line)")
    room = [MAX_HOSTS]

    def expand(item: str, source: str, where: str) -> list[str]:
        names = _expand(item, source, room[0])
        room[0] -= len(names)
        return names

    return hostfile.parse(text, option, path, expand=expand)


def parse_host_file(path: str) -> tuple[str, ...]:
    """The hosts of a host file, in order."""
    return read_host_file(path).hosts


def _refuse_duplicates(hosts: list[str], option: str, value: str | None = None) -> None:
    seen: set[str] = set()
    for host in hosts:
        if host in seen:
            raise PoprunError(
                option,
                value if value is not None else host,
                f"host {host!r} is listed twice",
                "list each host once; poprun divides the instances evenly over the hosts",
            )
        seen.add(host)


class HostSource(Protocol):
    """Where the hosts come from; ``option`` names it in error messages."""

    @property
    def option(self) -> str: ...

    def hosts(self) -> tuple[str, ...]:
        """The host names, expanded and checked (no duplicates)."""
        ...

    def place(self, num_instances: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """(hosts, instances on each): where ``num_instances`` instances run."""
        ...


def share_evenly(
    hosts: tuple[str, ...], num_instances: int
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Listed hosts get the same number of instances each: it must divide evenly."""
    if num_instances % len(hosts):
        raise PoprunError(
            "--num-instances",
            num_instances,
            f"cannot be divided evenly over {len(hosts)} hosts ({', '.join(hosts)})",
            f"use a multiple of {len(hosts)} instances, or list fewer hosts",
        )
    return hosts, (num_instances // len(hosts),) * len(hosts)


class HostList(NamedTuple):
    """``-H``/``--host`` values, each a comma-separated list of names and ranges."""

    values: tuple[str, ...]
    option: str = "--host"

    def hosts(self) -> tuple[str, ...]:
        return parse_host_list(self.values, self.option)

    def place(self, num_instances: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        return share_evenly(self.hosts(), num_instances)


class HostFile(NamedTuple):
    """``--host-file``: poprun's format (the hosts share the instances evenly) or Open MPI's
    (the instances fill the hosts in order up to their slots; more than the file's slots
    only with ``--oversubscribe`` in the mpirun arguments)."""

    path: str
    option: str = "--host-file"
    oversubscribe: bool = False

    def hosts(self) -> tuple[str, ...]:
        return read_host_file(self.path, self.option).hosts

    def place(self, num_instances: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        listed = read_host_file(self.path, self.option)
        if not listed.slotted:
            return share_evenly(listed.hosts, num_instances)
        slots = self._allocation(listed)
        return place(slots, num_instances, oversubscribe=self.oversubscribe, host_file=True)

    def slots(self) -> Allocation | None:
        """The file's slots as an allocation (None: poprun's format, no slots)."""
        listed = read_host_file(self.path, self.option)
        return self._allocation(listed) if listed.slotted else None

    def _allocation(self, listed: FileHosts) -> Allocation:
        return Allocation(
            "host file", "", listed.hosts, listed.slots, self.option, self.path,
            more="give the hosts more slots in the file",
        )  # fmt: skip


class JobHosts(NamedTuple):
    """The host source inside an engine's job given no ``-H``: the job's nodes, filled in
    order up to their slots (or shared evenly, where the engine lists hosts only)."""

    allocation: JobAllocation

    @property
    def option(self) -> str:
        return self.allocation.node_variable

    def hosts(self) -> tuple[str, ...]:
        return self.allocation.nodes

    def place(self, num_instances: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        if not self.allocation.slotted:
            return share_evenly(self.allocation.nodes, num_instances)
        return place(self.allocation, num_instances)


class WithinAllocation(NamedTuple):
    """Hosts named by the options inside a scheduler's job: they must be the job's nodes,
    with room for their share of the instances."""

    named: HostList | HostFile
    allocation: JobAllocation

    @property
    def option(self) -> str:
        return self.named.option

    def hosts(self) -> tuple[str, ...]:
        return self.named.hosts()

    def place(self, num_instances: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        placed = self.named.place(num_instances)
        check_hosts(self.allocation, *placed, self.option, num_instances)
        return placed


def host_source(
    values: Mapping[str, Any], allocation: JobAllocation | None = None
) -> HostSource | None:
    """The source the options name (``-H`` or ``--host-file``, not both), else the engine's
    job (``allocation``, :func:`poprun.plan.engines.detect.detect`); None: this host.

    Hosts named inside an allocation are checked against it (:class:`WithinAllocation`).
    """
    if "host" in values and "host_file" in values:
        raise PoprunError(
            "--host-file",
            values["host_file"],
            "conflicts with -H/--host",
            "give the hosts one way only",
        )
    named: HostList | HostFile | None = None
    if "host" in values:
        named = HostList(tuple(values["host"]))
    elif "host_file" in values:
        args = values.get("mpi_global_args", ())
        named = HostFile(values["host_file"], oversubscribe=bool(_OVERSUBSCRIBE & set(args)))
    if named is not None:
        return named if allocation is None else WithinAllocation(named, allocation)
    if allocation is not None:
        return JobHosts(allocation)
    return None


def is_local(host: str) -> bool:
    """Whether ``host`` names the machine poprun runs on: its name, the first label of its
    name (``job-launcher.job.default.svc`` in a pod named ``job-launcher``), a name
    ``/etc/hosts`` gives one of its addresses, or one of its addresses."""
    if host == "localhost":
        return True
    name = socket.gethostname()
    first = name.split(".", 1)[0]
    if host in {name, first} or host.split(".", 1)[0] == first or host in local_names():
        return True
    import ipaddress  # only for a host given by address: not on a local launch's path

    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address in local_addresses()


@functools.cache
def local_names(path: str = "/etc/hosts") -> frozenset[str]:
    """The names ``path`` gives this machine's own addresses (a pod's FQDN, an alias): read
    once, no lookup (a name only DNS knows is not recognised)."""
    import ipaddress

    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return frozenset()
    own = local_addresses()
    names: set[str] = set()
    for line in lines:
        words = line.split("#", 1)[0].split()
        if len(words) < 2:
            continue
        try:
            address = ipaddress.ip_address(words[0])
        except ValueError:
            continue
        if address.is_loopback or address in own:
            names.update(words[1:])
    return frozenset(names)


@functools.cache
def local_addresses() -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """This machine's own IP addresses (its network namespace's), read from /proc, no lookups.

    IPv4: the ``/32 host LOCAL`` entries of ``/proc/net/fib_trie``; IPv6: ``/proc/net/if_inet6``.
    """
    import ipaddress

    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    try:
        with open("/proc/net/fib_trie", encoding="ascii") as handle:
            last = ""
            for line in handle:
                text = line.strip()
                if text.startswith("|-- "):
                    last = text[4:]
                elif text.startswith("/32 host LOCAL") and last:
                    found.add(ipaddress.IPv4Address(last))
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as handle:
            for line in handle:
                fields = line.split()
                if fields:
                    found.add(ipaddress.IPv6Address(int(fields[0], 16)))
    except (OSError, ValueError):
        pass
    return frozenset(found)
