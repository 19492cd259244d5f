"""Hosts made of Linux network namespaces, with sshd, for multi-host runs on one machine.

Each host ``hK`` is a network namespace with ``lo`` and ``eth0`` (address ``10.77.0.1K/24``,
no default route), its own hostname and ``/etc/hosts`` (a UTS and a mount namespace held by
a holder process, ``sleep infinity``), and an sshd that accepts root by key only. The hosts'
``eth0`` ends meet on a bridge in one more namespace, the switch: the bridge is never in this
machine's own namespace, so nothing reaches the machine's network and nothing leaves it.

The client side is one executable, ``ssh-wrapper`` (``ssh -F <generated config>``, a
generated ``known_hosts``, ``BatchMode``), which Open MPI uses as its agent through
``OMPI_MCA_plm_rsh_agent``. Jobs are launched from *inside* a host (``Hosts.on``): the root
namespace has no route to the hosts, and a name lookup there would leave the machine.

For the clusters users have (``tests/multihost/pods.py``: Kubernetes pods, PBS and LSF
nodes), a set of hosts can also take other names (``names``), more names each in every
host's ``/etc/hosts`` (``aliases``: cluster-DNS FQDNs), directories that are the host's own
copy-on-write (``private_dirs``: files written there with :meth:`Hosts.write`, such as
``/etc/mpi/hostfile``, exist in that host only), no sshd of the harness's (``sshd=False``)
and sshds started and stopped at any time (:meth:`Hosts.start_sshd`, :meth:`Hosts.stop_sshd`).
Daemons of a harness built on the hosts (Grid Engine's) start inside a host with
:meth:`Hosts.spawn_daemon`; like the sshds they are never a job's leftovers.

Pure stdlib plus ``ip``, ``unshare``, ``nsenter``, ``ssh``, ``ssh-keygen`` and ``sshd``. Needs
root. ``python -m tests.support.hosts check`` (or ``tests.multihost.hosts``, its old name)
says whether this machine can run them; ``python -m tests.support.hosts up 2`` brings two
hosts up until Ctrl-C.

Facts behind this recipe: ``docs/multihost.md`` ("Testing without a cluster").
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support.processes import HARNESS_DAEMONS, end_with_parent, reap_children

SUBNET = "10.77.0"
#: Namespace names: ``pdh<pid of the creating process>_<set>-<host>``; a set whose creator
#: is dead is stale (its creator was killed) and the next set made removes it.
PREFIX = "pdh"
#: State directories (keys, configurations, logs): ``popdist-hosts-<creator's pid>-*``.
STATE_PREFIX = "popdist-hosts-"
_made = 0
#: A host name every host resolves (to an unused address) but whose sshd refuses: the
#: unreachable host. ssh reaches it on port 9 of h1, where nothing listens.
DOWN = "hdown"
TOOLS = ("ip", "unshare", "nsenter", "ssh", "ssh-keygen", "sshd")
_READY_S = 10.0


def _sshd_path() -> str | None:
    return shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/sbin")


def unavailable() -> str | None:
    """Why namespace hosts cannot be made here, or None when they can."""
    if sys.platform != "linux":
        return "namespace hosts need Linux"
    if os.geteuid() != 0:
        return "namespace hosts need root (network, UTS and mount namespaces)"
    for tool in TOOLS:
        found = _sshd_path() if tool == "sshd" else shutil.which(tool)
        if found is None:
            package = {
                "ip": "iproute2",
                "sshd": "openssh-server",
                "ssh": "openssh-client",
                "ssh-keygen": "openssh-client",
            }.get(tool, "util-linux")
            return f"{tool} is not installed (make setup installs {package})"
    probe = f"{PREFIX}{os.getpid()}_0-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or 'ip netns add failed'}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    """Alive and not a zombie (this container's init reaps orphans late)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def netns_pids(namespace: str) -> list[int]:
    """Live processes in ``namespace`` (``ip netns pids``), zombies left out."""
    done = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split() if p.isdigit() and _alive(int(p))]


def _kill_namespace(namespace: str) -> None:
    """SIGKILL every process in ``namespace`` (by pid), wait until they are gone, delete it."""
    for _ in range(50):
        pids = netns_pids(namespace)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reap_children()
        time.sleep(0.02)
    subprocess.run(["ip", "netns", "del", namespace], capture_output=True)


def remove_stale() -> list[str]:
    """Delete namespace sets, and their state directories, whose creating process is gone;
    return their names."""
    stale = []
    for state in Path(tempfile.gettempdir()).glob(f"{STATE_PREFIX}*-*"):
        match = re.fullmatch(rf"{STATE_PREFIX}(\d+)-\w+", state.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(state, ignore_errors=True)
            stale.append(state.name)
    try:
        names = [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line]
    except RuntimeError:
        return stale
    for name in names:
        match = re.fullmatch(rf"{PREFIX}(\d+)_\d+-\w+", name)
        if match and not _alive(int(match.group(1))):
            _kill_namespace(name)
            stale.append(name)
    return stale


class Hosts:
    """``count`` namespace hosts ``h1`` … ``hN``; use as a context manager, or :meth:`close`.

    ``names``: other host names (``pj-launcher``, ``pj-worker-0``, ...; namespaces, ports
    and addresses still go by position). ``aliases``: more names of a host, on its line of
    every host's ``/etc/hosts`` (``pj-worker-0.pj.default.svc``). ``private_dirs``:
    directories (``/etc``, ``/root``) that are each host's own copy-on-write view of this
    machine's, so that :meth:`write` can put files at real paths in one host only. ``sshd``:
    start the harness's sshd on each host (port 22, the wrapper's); without it a host has
    none until :meth:`start_sshd`.
    """

    def __init__(
        self,
        count: int,
        *,
        names: Sequence[str] = (),
        aliases: Mapping[str, Sequence[str]] | None = None,
        private_dirs: Sequence[str] = (),
        sshd: bool = True,
    ) -> None:
        if not 1 <= count <= 9:
            raise ValueError(f"count={count}: between 1 and 9 hosts")
        if names and len(names) != count:
            raise ValueError(f"{len(names)} names for {count} hosts")
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(reason)
        remove_stale()
        self.names = list(names) or [f"h{k}" for k in range(1, count + 1)]
        self.addresses = {name: f"{SUBNET}.{10 + k}" for k, name in enumerate(self.names, 1)}
        self.aliases = {name: list((aliases or {}).get(name, ())) for name in self.names}
        self.private_dirs = tuple(private_dirs)
        self.state = Path(tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{os.getpid()}-"))
        global _made
        _made += 1
        self._tag = f"{PREFIX}{os.getpid()}_{_made}"
        self._switch = f"{self._tag}-sw"
        self._holder: dict[str, subprocess.Popen[bytes]] = {}
        self._sshd: dict[str, subprocess.Popen[bytes]] = {}
        self._sshd_config: dict[str, Path] = {}
        self._daemons: dict[str, dict[int, subprocess.Popen[bytes]]] = {h: {} for h in self.names}
        self._namespaces: list[str] = []
        try:
            self._make_network()
            self._write_ssh_files()
            self._start_holders()
            if sshd:
                self._start_sshds()
        except BaseException:
            self.close()
            raise

    # --- set-up -------------------------------------------------------------------------------

    def _index(self, host: str) -> int:
        return self.names.index(host) + 1

    def namespace(self, host: str) -> str:
        """The network namespace of ``host``."""
        return f"{self._tag}-h{self._index(host)}"

    def _make_network(self) -> None:
        _run("ip", "netns", "add", self._switch)
        self._namespaces.append(self._switch)
        _run("ip", "-n", self._switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self._switch, "link", "set", "br0", "up")
        for host in self.names:
            ns = self.namespace(host)
            _run("ip", "netns", "add", ns)
            self._namespaces.append(ns)
            port = f"ph{self._index(host)}"
            _run("ip", "-n", self._switch, "link", "add", port, "type", "veth",
                 "peer", "name", "eth0", "netns", ns)  # fmt: skip
            _run("ip", "-n", self._switch, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def _write_ssh_files(self) -> None:
        s = self.state
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(s / "host_key"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(s / "client_key"))
        host_key = (s / "host_key.pub").read_text().split()
        (s / "authorized_keys").write_text((s / "client_key.pub").read_text())
        (s / "known_hosts").write_text(
            "".join(
                f"{','.join([h, *self.aliases[h], a])} {host_key[0]} {host_key[1]}\n"
                for h, a in self.addresses.items()
            )
        )
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        lines += [" ".join([a, *self.aliases[h], h]) for h, a in self.addresses.items()]
        lines.append(f"{SUBNET}.99 {DOWN}")
        (s / "hosts").write_text("\n".join(lines) + "\n")
        (s / "resolv.conf").write_text("# namespace hosts: names come from /etc/hosts only\n")
        config = []
        for host, address in self.addresses.items():
            config += [f"Host {' '.join([host, *self.aliases[host], address])}"]
            config += [f"    HostName {address}"]
        config += [f"Host {DOWN}", f"    HostName {self.addresses[self.names[0]]}", "    Port 9"]
        config += [
            "Host *",
            "    User root",
            f"    IdentityFile {s / 'client_key'}",
            "    IdentitiesOnly yes",
            "    BatchMode yes",
            f"    UserKnownHostsFile {s / 'known_hosts'}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    ConnectTimeout 5",
            "    LogLevel ERROR",
        ]
        (s / "ssh_config").write_text("\n".join(config) + "\n")
        wrapper = s / "ssh-wrapper"
        config_path = shlex.quote(str(s / "ssh_config"))
        wrapper.write_text(f'#!/bin/sh\nexec ssh -F {config_path} "$@"\n')
        wrapper.chmod(0o755)

    def _start_holders(self) -> None:
        """Each host's holder: its hostname, its private directories, its ``/etc/hosts``."""
        for host in self.names:
            d = self.state / host
            d.mkdir()
            q = {k: shlex.quote(str(v)) for k, v in (
                ("hosts", self.state / "hosts"), ("resolv", self.state / "resolv.conf"),
                ("ready", d / "ready"),
            )}  # fmt: skip
            script = [f"hostname {shlex.quote(host)}"]
            for k, directory in enumerate(self.private_dirs):
                cow = shlex.quote(str(d / f"cow{k}"))
                (d / f"cow{k}").mkdir()
                script += [
                    f"mount -t tmpfs -o size=64m,mode=755 tmpfs {cow}",
                    f"mkdir {cow}/upper {cow}/work",
                    f"mount -t overlay overlay -o lowerdir={shlex.quote(directory)},"
                    f"upperdir={cow}/upper,workdir={cow}/work {shlex.quote(directory)}",
                ]
            script += [
                f"mount --bind {q['hosts']} /etc/hosts",
                f"mount --bind {q['resolv']} /etc/resolv.conf",
                f"touch {q['ready']}",
                "exec sleep infinity",
            ]
            with open(d / "holder.log", "wb") as log:
                self._holder[host] = subprocess.Popen(
                    ["ip", "netns", "exec", self.namespace(host),
                     "unshare", "--uts", "--mount", "/bin/sh", "-c", " && ".join(script)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    start_new_session=True,
                )  # fmt: skip
            HARNESS_DAEMONS.add(self._holder[host].pid)
        deadline = time.monotonic() + _READY_S
        for host, proc in self._holder.items():
            while not (self.state / host / "ready").exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    text = (self.state / host / "holder.log").read_text(errors="replace")
                    raise RuntimeError(f"host {host} was not made: {text.strip()}")
                time.sleep(0.01)

    def sshd_config(self, host: str, *extra: str, listen: str = "") -> Path:
        """Write an sshd configuration for ``host`` (key login for root only, the harness's
        keys unless ``extra`` says otherwise; ``listen``: its ``ListenAddress`` lines, by
        default the host's address on port 22) and check it; return its path."""
        d = self.state / host
        path = d / f"sshd_config{len(list(d.glob('sshd_config*')))}"
        path.write_text(
            "\n".join(
                [
                    *extra,  # first: sshd takes the first value of each keyword
                    listen or f"ListenAddress {self.addresses[host]}",
                    f"HostKey {self.state / 'host_key'}",
                    f"PidFile {path}.pid",
                    f"AuthorizedKeysFile {self.state / 'authorized_keys'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "UseDNS no",
                    "PrintMotd no",
                    "PrintLastLog no",
                    "MaxStartups 200",
                    "MaxSessions 100",
                    "LogLevel ERROR",
                    # A session whose client went while the host was cut off (no FIN)
                    # ends within 6 s of the link coming back, as on a cluster that sets it
                    "ClientAliveInterval 2",
                    "ClientAliveCountMax 3",
                ]
            )
            + "\n"
        )
        sshd = _sshd_path()
        assert sshd is not None
        _run(sshd, "-t", "-f", str(path))
        return path

    def _start_sshds(self) -> None:
        for host in self.names:
            self.start_sshd(host, wait=False)
        for host in self.names:
            self._wait_listening(host)
        with ThreadPoolExecutor(len(self.names)) as pool:
            checks = list(pool.map(self._check, self.names))
        failed = [text for text in checks if text]
        if failed:
            raise RuntimeError("; ".join(failed))

    def start_sshd(
        self,
        host: str,
        config: Path | None = None,
        *,
        wait: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> int:
        """Start an sshd in ``host`` (``config``: by default :meth:`sshd_config`'s) and,
        with ``wait``, return once it listens; its pid. ``env``: the daemon's environment
        (a pod's: what its container was given), by default this process's."""  # fmt: skip
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        if host in self._sshd and self._sshd[host].poll() is None:
            raise RuntimeError(f"{host} already runs an sshd ({self._sshd[host].pid})")
        sshd = _sshd_path()
        assert sshd is not None
        config = config or self.sshd_config(host)
        Path(f"{config}.pid").unlink(missing_ok=True)
        log = self.state / host / f"{config.name}.log"
        argv = [sshd, "-D", "-f", str(config), "-E", str(log)]
        self._sshd[host] = self.spawn_daemon(host, argv, env=env)
        self._sshd_config[host] = config
        if wait:
            self._wait_listening(host)
        return self._sshd[host].pid

    def _wait_listening(self, host: str) -> None:
        proc = self._sshd[host]
        pidfile = Path(f"{self._sshd_config[host]}.pid")
        deadline = time.monotonic() + _READY_S
        while not pidfile.exists():  # sshd writes it once it listens
            if proc.poll() is not None or time.monotonic() > deadline:
                text = Path(f"{self.state / host}/start.log").read_text(errors="replace")
                raise RuntimeError(f"sshd on {host} did not start: {text.strip()}")
            time.sleep(0.01)

    def stop_sshd(self, host: str) -> None:
        """End ``host``'s sshd listener (by pid); sessions it already opened go on."""
        self.end_daemon(host, self._sshd.pop(host))

    def spawn_daemon(
        self,
        host: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """``argv`` started inside ``host`` as a daemon of the harness: in a session of its
        own, ended when this process dies (``PR_SET_PDEATHSIG``), never counted among a
        job's leftovers, and ended by pid at :meth:`close` (or :meth:`end_daemon`). Its
        stderr goes to ``start.log`` in the host's state directory.

        Start it from a thread that lives as long as the daemon should (the main thread):
        the kernel signals the daemon when the *thread* that started it ends."""  # fmt: skip
        with open(self.state / host / "start.log", "ab") as log:
            proc = subprocess.Popen(
                self.on(host, argv, cwd=cwd or "/"),
                env=dict(os.environ if env is None else env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                preexec_fn=functools.partial(end_with_parent, os.getpid()),
            )
        self._daemons[host][proc.pid] = proc
        HARNESS_DAEMONS.add(proc.pid)
        return proc

    def end_daemon(self, host: str, proc: subprocess.Popen[bytes], within: float = 10.0) -> None:
        """SIGTERM a daemon of :meth:`spawn_daemon` by pid; SIGKILL after ``within`` s."""
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=within)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._daemons[host].pop(proc.pid, None)
        HARNESS_DAEMONS.discard(proc.pid)

    def _check(self, host: str) -> str:
        done = subprocess.run(
            self.on(self.names[0], [str(self.ssh_wrapper), host, "hostname"]),
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0 or done.stdout.strip() != host:
            return f"ssh {host} hostname: {done.returncode} {done.stdout!r} {done.stderr.strip()}"
        return ""

    # --- use ----------------------------------------------------------------------------------

    @property
    def ssh_wrapper(self) -> Path:
        """The one-word ssh command for these hosts (Open MPI's ``plm_rsh_agent``)."""
        return self.state / "ssh-wrapper"

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` plus what mpirun and poprun need to reach these hosts."""
        return {**base, "OMPI_MCA_plm_rsh_agent": str(self.ssh_wrapper)}

    def sshd_pid(self, host: str) -> int:
        """The pid of ``host``'s sshd listener (KeyError when it runs none)."""
        return self._sshd[host].pid

    def holder_pid(self, host: str) -> int:
        """The pid of the process that holds ``host``'s namespaces."""
        return self._holder[host].pid

    def on(self, host: str, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """``argv`` run inside ``host`` (its network, hostname and /etc/hosts), same cwd and env."""
        return [
            "nsenter",
            "-t",
            str(self.holder_pid(host)),
            "-n",
            "-u",
            "-m",
            f"--wd={cwd or os.getcwd()}",
            "--",
            *argv,
        ]

    def own_disks(self, path: Path, size: str = "64m") -> None:
        """Give every host a disk of its own at ``path``: a tmpfs mounted in its mount
        namespace (private: the mount propagates nowhere). What one host writes there no
        other host sees, nor this machine; a host's disk goes with its last process."""
        path.mkdir(parents=True, exist_ok=True)
        for host in self.names:
            self.own_disk(host, path, size)

    def own_disk(self, host: str, path: Path, size: str = "64m") -> None:
        """A tmpfs of ``size`` at ``path`` (which must exist) in ``host`` only: a pod's
        ``/dev/shm`` of 64 MiB, say."""
        _run(*self.on(host, ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]))

    def read(self, host: str, path: Path) -> bytes | None:
        """``path``'s bytes as ``host`` sees them (its own disks included); None if absent."""
        done = subprocess.run(self.on(host, ["cat", str(path)]), capture_output=True)
        return done.stdout if done.returncode == 0 else None

    def write(self, host: str, path: str, data: str | bytes, mode: int = 0o644) -> None:
        """Put a file at ``path`` (absolute, under one of ``private_dirs``) in ``host`` only,
        its parent directories made as needed: what a pod's mounted ConfigMap or Secret is."""
        if not any(Path(path).is_relative_to(d) for d in self.private_dirs):
            raise ValueError(f"{path} is in no private directory of the hosts {self.private_dirs}")
        target = Path(f"/proc/{self.holder_pid(host)}/root{path}")  # its mount namespace's view
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
        target.chmod(mode)

    def _kept(self, host: str) -> set[int]:
        """The harness's own processes in ``host``: its holder and daemons (sshd included)."""
        return {self.holder_pid(host), *self._daemons[host]}

    def leftovers(self) -> dict[str, list[str]]:
        """Processes still running in each host's namespace, besides the harness's own (the
        holder, the sshd listener and the daemons of :meth:`spawn_daemon`)."""
        out: dict[str, list[str]] = {}
        for host in self.names:
            kept = self._kept(host)
            pids = [p for p in netns_pids(self.namespace(host)) if p not in kept]
            described = []
            for pid in pids:
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                described.append(f"{pid}: {cmd.decode(errors='replace').strip()}")
            if described:
                out[host] = described
        return out

    def wait_clean(self, within: float = 10.0) -> dict[str, list[str]]:
        """Wait up to ``within`` s for every host to hold only the harness's processes;
        return what is left."""
        deadline = time.monotonic() + within
        while True:
            reap_children()
            left = self.leftovers()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    def close_jobs(self) -> None:
        """SIGKILL, by pid, every process in the hosts except the harness's own."""
        for host in self.names:
            kept = self._kept(host)
            for pid in netns_pids(self.namespace(host)):
                if pid not in kept:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        reap_children()

    # --- faults -------------------------------------------------------------------------------

    def cut(self, host: str, down: bool = True) -> None:
        """Take ``host``'s port on the switch down (``down``) or up again: its link is cut
        silently, no FIN, no RST; its processes and sshd run on, unreachable."""
        port = f"ph{self._index(host)}"
        _run("ip", "-n", self._switch, "link", "set", port, "down" if down else "up")

    def freeze(self, host: str, frozen: bool = True) -> None:
        """SIGSTOP (``frozen``) or SIGCONT every process of ``host``, its sshd included: the
        kernel still accepts connections there, nothing answers them."""
        for pid in netns_pids(self.namespace(host)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def crash(self, host: str) -> None:
        """SIGKILL every process of ``host``, its sshd included (ssh is then refused there)."""
        for pid in netns_pids(self.namespace(host)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reap_children()

    def processes(self, host: str, word: str) -> list[int]:
        """The live processes of ``host`` whose command line holds ``word``."""
        found = []
        for pid in netns_pids(self.namespace(host)):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if word.encode() in cmd:
                found.append(pid)
        return found

    # --- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process in the hosts (by pid), delete the namespaces and the state dir."""
        for ns in reversed(self._namespaces):
            _kill_namespace(ns)
        for proc in [
            *self._holder.values(),
            *(p for d in self._daemons.values() for p in d.values()),
        ]:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            HARNESS_DAEMONS.discard(proc.pid)
        self._namespaces.clear()
        shutil.rmtree(self.state, ignore_errors=True)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def hosts(count: int) -> Iterator[Hosts]:
    """``count`` namespace hosts for the duration of the block."""
    made = Hosts(count)
    try:
        yield made
    finally:
        made.close()


def main(argv: list[str]) -> int:
    """``check``: can this machine run the multi-host tier? ``up N``: hosts until Ctrl-C."""
    if argv[:1] == ["check"]:
        reason = unavailable()
        if reason is None:
            print("multi-host tier: runs (namespace hosts with sshd can be made here)")
            return 0
        print(f"multi-host tier: skipped: {reason}")
        return 1
    if argv[:1] == ["up"] and len(argv) == 2 and argv[1].isdigit():
        started = time.monotonic()
        with hosts(int(argv[1])) as made:
            print(f"{len(made.names)} hosts up in {time.monotonic() - started:.2f} s: ", end="")
            print(", ".join(f"{h} {a}" for h, a in made.addresses.items()))
            print(f"enter one:  {' '.join(made.on(made.names[0], ['bash']))}")
            print(f"then:       export OMPI_MCA_plm_rsh_agent={made.ssh_wrapper}")
            print("Ctrl-C tears them down.", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
        return 0
    print("usage: python -m tests.support.hosts check | up N", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
