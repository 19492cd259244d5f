"""Namespace hosts as the pods of a Kubernetes MPI job: an MPIJob, a TrainJob, a Volcano job.

No real Kubernetes can run here (``docs/clusters.md``), so :class:`Pods` gives poprun the
operator's contract on namespace hosts (:mod:`tests.support.hosts`), at the real paths,
each host's own:

- the pods' names as their hostnames (``pj-launcher``, ``pj-worker-0``, ...), and every
  pod's cluster-DNS name (``pj-worker-0.pj.default.svc``) in every host's ``/etc/hosts``;
- the launcher's ``/etc/mpi/hostfile`` (0444, a line a worker: ``FQDN slots=N``, the
  launcher's own first with ``runLauncherAsWorker``) and, for an MPIJob,
  ``/etc/mpi/discover_hosts.sh`` (0555);
- the ssh Secret in every pod (``/root/.ssh/id_rsa`` 0600, an ECDSA key as the operator
  makes, ``id_rsa.pub``, ``authorized_keys``) and the operator image's ssh set-up:
  ``/etc/ssh/ssh_config`` with ``StrictHostKeyChecking no``, ``UserKnownHostsFile
  /dev/null`` and ``Port 2222``, and each worker's ``sshd`` on port 2222 (``StrictModes
  no``), started with the worker container's environment; no ``OMPI_MCA_plm_rsh_agent``
  anywhere: plain ``ssh``, as in a real pod;
- the launcher's environment exactly as the operator sets it (:meth:`Pods.launcher_env`);
- the image's own ``/root/.bashrc`` (empty), not this machine's: bash runs it in every ssh
  session (sshd starts ``bash -c``), and a developer's one (pyenv's ``rehash``, which takes
  a lock file under ``/root`` and waits 60 s for it) is no pod's. In a pod's private
  ``/root`` a rehash killed with the job it ran for kept that lock, and every later session
  there waited a minute before it began.

A worker's sshd can start late (``late``: started by :meth:`Pods.start_sshd`), as with
``launcherCreationPolicy: AtStartup``; workers can have a ``/dev/shm`` of 64 MiB, Docker's
default (``shm``). The launcher runs no sshd (its container runs the user's command).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.hosts import Hosts

ROOT = Path(__file__).resolve().parents[2]
HOSTFILE = "/etc/mpi/hostfile"
SSH_PORT = 2222
#: What every pod has from Kubernetes (the API server's Service), launcher and workers alike.
CLUSTER_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


@dataclass(frozen=True)
class Layout:
    """The pods an operator makes for one job: their names and cluster-DNS names, and what
    the launcher is given."""

    kind: str  # "mpijob", "trainjob", "volcano"
    job: str
    launcher: str
    workers: tuple[str, ...]
    domain: str  # the FQDN's suffix after the pod's name
    #: the launcher is also a worker: its own line first in the host file
    launcher_works: bool = False
    ssh_port: int = SSH_PORT

    def fqdn(self, pod: str) -> str:
        return f"{pod}.{self.domain}"

    @property
    def pods(self) -> tuple[str, ...]:
        return (self.launcher, *self.workers)

    @property
    def nodes(self) -> tuple[str, ...]:
        """The pods that run instances, in the host file's order."""
        return (self.launcher, *self.workers) if self.launcher_works else self.workers


def mpijob(name: str = "pj", workers: int = 2, *, launcher_works: bool = False) -> Layout:
    """MPI Operator v2: ``<job>-launcher``, ``<job>-worker-<i>``, the headless Service
    ``<job>`` in namespace ``default``."""
    return Layout(
        "mpijob", name, f"{name}-launcher", tuple(f"{name}-worker-{i}" for i in range(workers)),
        f"{name}.default.svc", launcher_works,
    )  # fmt: skip


def trainjob(name: str = "tj", nodes: int = 2, *, launcher_works: bool = False) -> Layout:
    """Trainer v2's MPI runtime (JobSet names): ``<tj>-launcher-0-0``, ``<tj>-node-0-<i>``,
    subdomain ``<tj>``; with ``runLauncherAsNode`` the launcher is one of the nodes."""
    count = nodes - 1 if launcher_works else nodes
    return Layout(
        "trainjob", name, f"{name}-launcher-0-0",
        tuple(f"{name}-node-0-{i}" for i in range(count)), name, launcher_works,
    )  # fmt: skip


def volcano(name: str = "vj", workers: int = 2) -> Layout:
    """Volcano's MPI plugin: tasks ``master`` and ``worker``, pods ``<job>-<task>-<i>``,
    subdomain ``<job>`` (its svc plugin), ssh on port 22 (its ssh plugin)."""
    return Layout(
        "volcano", name, f"{name}-master-0", tuple(f"{name}-worker-{i}" for i in range(workers)),
        name, ssh_port=22,
    )  # fmt: skip


class Pods:
    """The pods of ``layout`` on namespace hosts, each worker's sshd up unless ``late``.

    ``slots``: the MPIJob's ``slotsPerWorker`` (the TrainJob's ``numProcPerNode``). ``shm``:
    each worker's ``/dev/shm`` size (``"64m"``), by default this machine's.
    """

    def __init__(
        self, layout: Layout, *, slots: int = 2, late: Sequence[str] = (), shm: str = ""
    ) -> None:
        self.layout = layout
        self.slots = slots
        self.hosts = Hosts(
            len(layout.pods),
            names=layout.pods,
            aliases={pod: [layout.fqdn(pod)] for pod in layout.pods},
            private_dirs=("/etc", "/root"),
            sshd=False,
        )
        try:
            self._mount_secret_and_config()
            for worker in layout.workers:
                if shm:
                    self.hosts.own_disk(worker, Path("/dev/shm"), shm)
                if worker not in late:
                    self.start_sshd(worker)
        except BaseException:
            self.hosts.close()
            raise

    def _mount_secret_and_config(self) -> None:
        state, layout = self.hosts.state, self.layout
        key = state / "secret_key"
        done = subprocess.run(
            ["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(key)], capture_output=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"ssh-keygen: {done.stderr.decode()}")
        public = key.with_suffix(".pub").read_text()
        client = (
            Path("/etc/ssh/ssh_config").read_text() if Path("/etc/ssh/ssh_config").exists() else ""
        )
        client += "\n".join(
            ["", "Host *", "    StrictHostKeyChecking no", "    UserKnownHostsFile /dev/null",
             f"    Port {layout.ssh_port}", ""]
        )  # fmt: skip
        for pod in layout.pods:
            self.hosts.write(pod, "/root/.ssh/id_rsa", key.read_bytes(), 0o600)
            self.hosts.write(pod, "/root/.ssh/id_rsa.pub", public, 0o644)
            self.hosts.write(pod, "/root/.ssh/authorized_keys", public, 0o644)
            self.hosts.write(pod, "/etc/ssh/ssh_config", client, 0o644)
            self.hosts.write(pod, "/root/.bashrc", "", 0o644)
        lines = [f"{layout.fqdn(pod)} slots={self.slots}\n" for pod in layout.nodes]
        if layout.kind != "volcano":
            self.hosts.write(layout.launcher, HOSTFILE, "".join(lines), 0o444)
        if layout.kind == "mpijob":
            discover = "#!/bin/sh\n" + "".join(f"echo {layout.fqdn(w)}\n" for w in layout.workers)
            self.hosts.write(layout.launcher, "/etc/mpi/discover_hosts.sh", discover, 0o555)

    # --- the pods' processes -----------------------------------------------------------------

    def worker_env(self, pod: str) -> dict[str, str]:
        """A worker container's environment (its sshd's; ssh sessions do not inherit it)."""
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        env.update(CLUSTER_ENV, HOSTNAME=pod)
        if self.layout.kind == "mpijob":
            env["K_MPI_JOB_ROLE"] = "worker"
        return env

    def start_sshd(self, pod: str) -> int:
        """``pod``'s sshd on its port, as the operator's worker command (``sshd -De``) runs it:
        the Secret's authorized keys, ``StrictModes no``. Returns its pid once it listens."""
        config = self.hosts.sshd_config(
            pod, "AuthorizedKeysFile .ssh/authorized_keys",
            listen=f"ListenAddress 0.0.0.0:{self.layout.ssh_port}",
        )  # fmt: skip
        return self.hosts.start_sshd(pod, config, env=self.worker_env(pod))

    def stop_sshd(self, pod: str) -> None:
        self.hosts.stop_sshd(pod)

    def launcher_env(self, base: Mapping[str, str], **extra: str) -> dict[str, str]:
        """``base`` with the launcher container's environment as the operator sets it."""
        layout = self.layout
        env = {**base, **CLUSTER_ENV, "HOSTNAME": layout.launcher}
        if layout.kind in ("mpijob", "trainjob"):
            env.update(
                OMPI_MCA_orte_keep_fqdn_hostnames="true",
                OMPI_MCA_orte_default_hostfile=HOSTFILE,
                OMPI_MCA_plm_rsh_args="-o ConnectionAttempts=10",
                OMPI_MCA_orte_set_default_slots=str(self.slots),
            )
        if layout.kind == "mpijob":
            env["K_MPI_JOB_ROLE"] = "launcher"
            if not layout.launcher_works:  # "not to use GPU resources for the launcher"
                env.update(NVIDIA_VISIBLE_DEVICES="", NVIDIA_DRIVER_CAPABILITIES="")
        if layout.kind == "volcano":
            fqdns = ",".join(layout.fqdn(w) for w in layout.workers)
            env.update(
                MPI_HOST=fqdns, VC_WORKER_HOSTS=fqdns, VC_WORKER_NUM=str(len(layout.workers))
            )
        env.update(extra)
        return env

    def on_launcher(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the launcher pod, from this repository's root."""
        return self.hosts.on(self.layout.launcher, argv, cwd=str(ROOT))

    def close(self) -> None:
        self.hosts.close()

    def __enter__(self) -> Pods:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
