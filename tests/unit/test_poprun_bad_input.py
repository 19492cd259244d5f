"""Bad input: exit 2, a short message naming the option, the value and the fix; nothing
launched (a fake mpirun first on PATH records any call) and no file written.

``python -m tests.unit.test_poprun_bad_input`` prints the table in docs/bad-input.md.
"""

from __future__ import annotations

import io
import itertools
import os
import stat
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from poprun.cli import main

pytestmark = pytest.mark.unit


def _bomb(levels: int) -> str:
    """A YAML flow list whose aliases expand to 9**levels values."""
    names = "abcdefghi"[:levels]
    parts = ["&a [x, x, x, x, x, x, x, x, x]"]
    parts += [f"&{n} [{', '.join(['*' + p] * 9)}]" for p, n in itertools.pairwise(names)]
    return "[" + ", ".join(parts) + f", *{names[-1]}]"


FILES = {
    "empty.hosts": "# nothing here\n\n",
    "dup.hosts": "node0\nnode1 # second\nnode0\n",
    "neither.hosts": "node0 slots=2\nnode1 fast\n",
    "zero.hosts": "node0 slots=0\n",
    "slots.hosts": "# Open MPI's format\nnode0 slots=2\nnode1:2\n",
    "bad.yaml": "num-replicas: [1\n",
    "unknown.yaml": "num-replicas: 2\nnum-gpus: 4\n",
    "list.yaml": "- 1\n- 2\n",
    "wrongtype.yaml": "num-replicas: [1, 2]\n",
    "exists.yaml": "num-replicas: 1\n",
    "notexec.sh": "#!/bin/sh\n",
    "a-file": "",
    "bomb.yaml": f"num-replicas: {_bomb(6)}\n",
    "vipu-bomb.yaml": f"vipu-partition: {_bomb(6)}\n",
    "self.yaml": "num-replicas: &a [1, *a]\n",
    "big.hosts": "node0\n" + "#" * (2 << 20) + "\n",
    "dryrun.yaml": "dry-run: yes\n",
    "noshebang.py": "print('hello')\n",
}

#: (case, argv, words the one-line message must contain)
CASES: list[tuple[str, list[str], list[str]]] = [
    ("non-integer count", ["--num-replicas", "abc", "true"], ["--num-replicas=abc", "integer"]),
    ("zero count", ["--num-replicas", "0", "true"], ["--num-replicas=0", "positive"]),
    ("negative count", ["--num-instances=-2", "true"], ["--num-instances=-2", "positive"]),
    ("fractional devices", ["--ipus-per-replica", "1.5", "true"], ["--ipus-per-replica=1.5"]),
    ("zero devices", ["--ipus-per-replica", "0", "true"], ["--ipus-per-replica=0"]),
    (
        "replicas not divisible",
        ["--num-replicas", "3", "--num-instances", "2", "true"],
        ["--num-replicas=3", "divisible", "multiple of 2"],
    ),
    (
        "more instances than replicas",
        ["--num-replicas", "2", "--num-instances", "4", "true"],
        ["--num-instances=4", "more than --num-replicas=2"],
    ),
    (
        "unknown option",
        ["--num-replica", "2", "true"],
        ["--num-replica", "did you mean --num-replicas"],
    ),
    ("option without its value", ["--num-replicas"], ["--num-replicas", "needs a value"]),
    ("flag given a value", ["--version=3"], ["--version", "takes no value"]),
    ("backwards host range", ["-H", "node[3-1]", "true"], ["--host=node[3-1]", "backwards"]),
    ("non-numeric host range", ["-H", "node[a-b]", "true"], ["--host=node[a-b]", "not N or N-M"]),
    ("unbalanced host bracket", ["-H", "node[0-2", "true"], ["--host=node[0-2", "brackets"]),
    (
        "empty host in list",
        ["-H", "a,,b", "--num-instances", "2", "--num-replicas", "2", "true"],
        ["--host=a,,b", "empty host"],
    ),
    ("duplicate host", ["-H", "a,a", "true"], ["'a' is listed twice"]),
    ("host with slots", ["-H", "a:4", "true"], ["--host=a:4", "slots"]),
    (
        "instances not divisible by hosts",
        ["-H", "a,b", "--num-instances", "3", "--num-replicas", "3", "true"],
        ["--num-instances=3", "2 hosts"],
    ),
    (
        "empty host file",
        ["--host-file", "empty.hosts", "true"],
        ["--host-file=empty.hosts", "no hosts"],
    ),
    (
        "host file line in neither format",
        ["--host-file", "neither.hosts", "true"],
        ["--host-file=neither.hosts:2", "'node1 fast' is in neither", "slots=N"],
    ),
    (
        "slots= not a positive integer",
        ["--host-file", "zero.hosts", "true"],
        ["--host-file=zero.hosts:1", "slots '0' is not a positive whole number"],
    ),
    (
        "more instances than a host file's slots",
        ["--host-file", "slots.hosts", "--num-instances", "6", "--num-replicas", "6", "true"],
        ["--num-instances=6", "more than the 4 slots of host file", "slots.hosts", "--oversubscribe"],
    ),
    (
        "missing host file",
        ["--host-file", "nope.hosts", "true"],
        ["--host-file=nope.hosts", "cannot read"],
    ),
    (
        "host and host file",
        ["-H", "a", "--host-file", "dup.hosts", "true"],
        ["--host-file", "conflicts with -H"],
    ),
    (
        "unreadable YAML",
        ["--import-config", "missing.yaml", "true"],
        ["--import-config=missing.yaml", "cannot read"],
    ),
    (
        "malformed YAML",
        ["--import-config", "bad.yaml", "true"],
        ["--import-config=bad.yaml", "not valid YAML"],
    ),
    ("unknown YAML key", ["--import-config", "unknown.yaml", "true"], ["unknown key 'num-gpus'"]),
    ("YAML not a mapping", ["--import-config", "list.yaml", "true"], ["not a mapping"]),
    (
        "YAML value of the wrong type",
        ["--import-config", "wrongtype.yaml", "true"],
        ["--num-replicas=[1, 2]", "whole number"],
    ),
    ("no program", ["--num-replicas", "2", "--num-instances", "2"], ["no program"]),
    (
        "program does not exist",
        ["./no-such-program"],
        ["program=./no-such-program", "does not exist"],
    ),
    (
        "program not on PATH",
        ["no-such-program-xyz"],
        ["program=no-such-program-xyz", "not found on PATH"],
    ),
    (
        "program not executable",
        ["./notexec.sh"],
        ["program=./notexec.sh", "not executable", "chmod +x"],
    ),
    (
        "mpirun not on PATH",
        ["--mpirun-missing", "/bin/true"],
        ["mpirun", "not on PATH", "install Open MPI"],
    ),
    (
        "output filter out of range",
        ["--num-replicas", "2", "--num-instances", "2", "--only-output-from-instance", "2", "true"],
        ["--only-output-from-instance=2", "0 to 1"],
    ),
    (
        "negative output filter",
        ["--only-output-from-instance=-1", "true"],
        ["--only-output-from-instance=-1"],
    ),
    (
        "instance local args out of range",
        ["--instance-mpi-local-args=5:-x A", "true"],
        ["instance 5 is out of range"],
    ),
    (
        "instance local args without index",
        ["--instance-mpi-local-args", "-x A", "true"],
        ["no 'INDEX:' prefix"],
    ),
    (
        "unbalanced quote in MPI args",
        ["--mpi-global-args", "--mca x 'y", "true"],
        ["--mpi-global-args", "balance the quotes"],
    ),
    ("negative timeout", ["--timeout=-5", "true"], ["--timeout=-5", "more than 0"]),
    ("non-numeric timeout", ["--timeout", "soon", "true"], ["--timeout=soon", "seconds"]),
    (
        "unknown placement",
        ["--process-placement", "everywhere", "true"],
        ["--process-placement=everywhere", "spreadnuma or disabled"],
    ),
    ("unknown backend", ["--backend", "mpi", "true"], ["--backend=mpi", "horovod or torch"]),
    ("bad yes/no value", ["--offline-mode=maybe", "true"], ["--offline-mode=maybe", "yes/no"]),
    (
        "deterministic reduction, bad yes/no",
        ["--deterministic-reduction=sometimes", "true"],
        ["--deterministic-reduction=sometimes", "yes/no"],
    ),
    (
        "conflicting NUMA options",
        ["--numa-aware", "yes", "--process-placement", "disabled", "true"],
        ["--numa-aware=yes", "conflicts"],
    ),
    (
        "export over an existing file",
        ["--export-config", "exists.yaml", "true"],
        ["--export-config=exists.yaml", "--overwrite-config"],
    ),
    (
        "output dir is a file",
        ["--output-dir", "a-file", "true"],
        ["--output-dir=a-file", "not a directory"],
    ),
    (
        "bad host subnet",
        ["--host-subnet", "10.0.0.0/99", "true"],
        ["--host-subnet=10.0.0.0/99", "CIDR"],
    ),
    (
        "host range of 100 million hosts",
        ["-H", "node[0-99999999]", "true"],
        ["--host=node[0-99999999]", "more than 65536 hosts"],
    ),
    (
        "host ranges over the host limit together",
        ["-H", "a[0-40000]", "-H", "b[0-40000]", "true"],
        ["--host=b[0-40000]", "more than 65536 hosts"],
    ),
    (
        "host range number of 5000 digits",
        ["-H", "n[0-" + "9" * 5000 + "]", "true"],
        ["more than 9 digits", "(5005 characters)"],
    ),
    ("host file /dev/zero", ["--host-file", "/dev/zero", "true"], ["not a regular file"]),
    ("host file is a FIFO", ["--host-file", "hosts.fifo", "true"], ["not a regular file"]),
    ("host file over 1 MiB", ["--host-file", "big.hosts", "true"], ["larger than 1 MiB"]),
    ("YAML file /dev/zero", ["--import-config", "/dev/zero", "true"], ["not a regular file"]),
    ("YAML file is a FIFO", ["--import-config", "config.fifo", "true"], ["not a regular file"]),
    ("YAML file is a directory", ["--import-config", "fakebin", "true"], ["is a directory"]),
    (
        "YAML alias bomb in a value",
        ["--import-config", "bomb.yaml", "true"],
        ["--import-config=bomb.yaml", "expands to more than 100000 values"],
    ),
    (
        "YAML alias bomb in a V-IPU key",
        ["--import-config", "vipu-bomb.yaml", "true"],
        ["expands to more than 100000 values"],
    ),
    ("YAML alias to itself", ["--import-config", "self.yaml", "true"], ["refers to itself"]),
    ("YAML key of the command line only", ["--import-config", "dryrun.yaml", "true"],
     ["'dry-run' is a poprun option of the command line only", "--dry-run"]),
    ("output dir under a file", ["--output-dir", "a-file/logs", "true"],
     ["is a file, so the directory cannot be created"]),
    ("output dir in /proc", ["--output-dir", "/proc/self/logs", "true"], ["kernel file system"]),
    ("output dir with a directory for a file",
     ["--num-instances", "2", "--num-replicas", "2", "--output-dir", "outdir", "true"],
     ["instance-1.stderr is a directory"]),
    ("export config into /proc", ["--export-config", "/proc/self/run.yaml", "true"],
     ["--export-config=/proc/self/run.yaml", "kernel file system"]),
    ("mpirun's -np", ["-np", "2", "true"], ["-np: is mpirun's option", "--num-instances"]),
    ("mpirun's --hostfile", ["--hostfile", "h", "true"], ["use --host-file"]),
    ("stray word in MPI args", ["--mpi-local-args", "echo", "true"],
     ["--mpi-local-args=echo", "'echo' is not an mpirun option"]),
    ("-np in MPI args", ["--mpi-global-args", "-np 4", "true"],
     ["--mpi-global-args=-np 4", "use poprun's --num-instances"]),
    ("-H in MPI args", ["--mpi-global-args=-H a,b", "true"], ["use poprun's --host or --host-file"]),
    ("--app in MPI args", ["--mpi-global-args=--app f", "true"], ["poprun writes the app contexts"]),
    ("POPDIST variable in MPI args", ["--mpi-local-args=-x POPDIST_NUM_INSTANCES=3", "true"],
     ["leave POPDIST_* to poprun"]),
    ("program is a directory", ["./fakebin"], ["program=./fakebin: is a directory"]),
    ("program without #! line", ["./noshebang.py"],
     ["Exec format error", "#!/usr/bin/env python3"]),
    ("negative hang time-out", ["--hang-timeout", "-3", "true"], ["--hang-timeout=-3", "positive"]),
    ("unknown hang action", ["--on-hang", "maybe", "true"], ["--on-hang=maybe", "kill or report"]),
    ("status port out of range", ["--status-port", "99999", "true"],
     ["--status-port=99999", "0 to 65535"]),
    ("status address alone", ["--status-address", "0.0.0.0", "true"],
     ["--status-address=0.0.0.0", "add --status-port"]),
    ("negative time-limit margin", ["--time-limit-margin", "-5", "true"],
     ["--time-limit-margin=-5", "positive"]),
    ("margin with no deadline", ["--time-limit-margin", "30", "true"],
     ["--time-limit-margin=30", "no deadline", "--timeout"]),
    ("requeue outside Slurm", ["--requeue-on-timeout", "true"],
     ["--requeue-on-timeout", "SLURM_JOB_ID is not set"]),
    ("--min-hosts above the host count",
     ["-H", "a,b", "--num-instances", "2", "--num-replicas", "2", "--min-hosts", "3", "true"],
     ["--min-hosts=3", "more than the job's 2 hosts", "--min-hosts 2 or fewer"]),
    ("--min-hosts zero", ["-H", "a,b", "--num-instances", "2", "--num-replicas", "2",
     "--min-hosts", "0", "true"], ["--min-hosts=0", "positive"]),
    ("--min-hosts not a number", ["--min-hosts", "two", "true"], ["--min-hosts=two", "integer"]),
    ("--min-hosts on one host", ["--min-hosts", "1", "true"],
     ["--min-hosts=1", "needs a job across hosts"]),
    ("--readmit without --min-hosts",
     ["-H", "a,b", "--num-instances", "2", "--num-replicas", "2", "--readmit", "true"],
     ["--readmit=yes", "needs --min-hosts"]),
    ("--readmit not yes or no", ["--readmit=maybe", "true"], ["--readmit=maybe"]),
]  # fmt: skip


def _setup(tmp: Path, monkeypatch: pytest.MonkeyPatch, *, with_mpirun: bool = True) -> Path:
    for name, text in FILES.items():
        (tmp / name).write_text(text)
    for name in ("hosts.fifo", "config.fifo"):  # no writer: reading one would block forever
        os.mkfifo(tmp / name)
    (tmp / "noshebang.py").chmod(0o755)  # executable, but no #! line
    (tmp / "outdir" / "instance-1.stderr").mkdir(parents=True)
    fake = tmp / "fakebin"
    fake.mkdir()
    if with_mpirun:
        mpirun = fake / "mpirun"
        mpirun.write_text(f"#!/bin/sh\ntouch {tmp}/MPIRUN-WAS-CALLED\n")
        mpirun.chmod(mpirun.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake}:/usr/bin:/bin" if with_mpirun else str(fake))
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)  # the cases are outside a Slurm job, wherever the suite runs
    monkeypatch.chdir(tmp)
    return tmp


def run_case(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([a for a in argv if a != "--mpirun-missing"])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(("case", "argv", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_clear_line(
    case: str, argv: list[str], words: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = _setup(tmp_path, monkeypatch, with_mpirun="--mpirun-missing" not in argv)
    before = sorted(p.name for p in tmp.iterdir())
    code, out, err = run_case(argv)
    assert code == 2, (case, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("poprun: error: "), err
    assert len(lines[0]) < 600, lines[0][:600]  # a line to read, not a dump of the value
    assert "fix:" in lines[0] and "Traceback" not in err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert out == ""
    assert sorted(p.name for p in tmp.iterdir()) == before  # nothing launched, nothing written


def test_there_are_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30


def _table() -> str:  # pragma: no cover - docs generator
    import tempfile

    rows = ["| case | command line | message |", "|---|---|---|"]
    for case, argv, _ in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            mp = pytest.MonkeyPatch()
            try:
                _setup(Path(tmp), mp, with_mpirun="--mpirun-missing" not in argv)
                _, _, err = run_case(argv)
            finally:
                mp.undo()
        shown = " ".join(
            a if len(a) < 60 else a[:30] + "…" for a in argv if a != "--mpirun-missing"
        )
        cmd = f"`poprun {shown}`" + (" (no mpirun on PATH)" if "--mpirun-missing" in argv else "")
        message = err.strip().replace("|", "\\|")
        rows.append(f"| {case} | {cmd.replace('|', chr(92) + '|')} | `{message}` |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("COLUMNS", "200")
    sys.stdout.write(_table() + "\n")
