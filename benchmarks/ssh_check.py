"""The ssh check at hundreds of hosts (issue 53): bounded concurrency, total time about
hosts ÷ concurrency × one login.

poprun's check before a launch across hosts (``poprun/run/ssh_check.py``) tries
``CONCURRENCY`` hosts at a time. Here it runs against a stand-in agent whose every "login"
takes ``--login`` seconds (a shell that sleeps, then succeeds), for 16 to 1,024 hosts, in
this process, as ``poprun`` calls it; beside each time, the ideal ``ceil(hosts /
CONCURRENCY) × login``, and the most processes the check had at once (its tries are
children of this process: counted from ``/proc`` every 10 ms). (poprun also prints one line
when there are more hosts than the concurrency; that is ``check``'s, not timed here.)

    .venv/bin/python benchmarks/ssh_check.py [--login 0.2] [--rounds 3]

Writes docs/ssh-check.{md,json}.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from _common import machine, save_results, table, write_doc

from poprun.run import ssh_check

SIZES = (16, 64, 128, 256, 512, 1024)


def _children() -> int:
    """This process's live children (the check's tries)."""
    me = str(os.getpid())
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] not in ("Z", "X"):
            count += 1
    return count


def one(hosts: int, agent: str) -> dict[str, float]:
    """The check of ``hosts`` stand-in hosts: its time and the most tries at once."""
    most = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            most[0] = max(most[0], _children())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    bad = ssh_check.unreachable([f"node{i:04d}" for i in range(hosts)], [agent])
    took = time.perf_counter() - start
    done.set()
    sampler.join()
    assert not bad, bad[:3]
    return {"s": took, "at_once": float(most[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--login", type=float, default=0.2, help="seconds a stand-in login takes")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    agent = Path(tempfile.mkdtemp(prefix="ssh-check-bench-")) / "agent"
    agent.write_text(f"#!/bin/sh\nexec sleep {args.login}\n")
    agent.chmod(0o755)
    data: dict[str, Any] = {
        "login_s": args.login, "concurrency": ssh_check.CONCURRENCY, "sizes": {},
        "machine": machine(),
    }  # fmt: skip
    for hosts in SIZES:
        runs = [one(hosts, str(agent)) for _ in range(args.rounds)]
        ideal = math.ceil(hosts / ssh_check.CONCURRENCY) * args.login
        data["sizes"][str(hosts)] = {
            "s": [r["s"] for r in runs],
            "ideal_s": ideal,
            "ratio": [r["s"] / ideal for r in runs],
            "at_once": max(r["at_once"] for r in runs),
        }
        print(hosts, data["sizes"][str(hosts)], flush=True)
    save_results("ssh-check", data)
    rows = [
        [hosts, f"{statistics.median(e['s']):.2f} s ({min(e['s']):.2f}–{max(e['s']):.2f})",
         f"{e['ideal_s']:.2f} s", f"{statistics.median(e['ratio']):.2f}", f"{e['at_once']:.0f}"]
        for hosts, e in data["sizes"].items()
    ]  # fmt: skip
    body = "\n\n".join([
        (__doc__ or "").split("\n\n", 1)[1].rsplit("\n\n    .venv", 1)[0].strip(),
        f"A login of {args.login:g} s, {ssh_check.CONCURRENCY} at a time, {args.rounds} rounds; "
        "median (min–max).",
        table(["hosts", "the check", "ideal: ⌈hosts / concurrency⌉ × login", "ratio",
               "tries at once (most)"], rows),
    ])  # fmt: skip
    write_doc("ssh-check.md", "The ssh check at hundreds of hosts", body)
    print(body)


if __name__ == "__main__":
    main()
