"""What the live status page costs a job (issue 32): training with the page open and closed.

    .venv/bin/python benchmarks/status_page.py [--pairs 24] [--window 4] [--per-round 4]

One poprun launch with ``--status-port 0``: the training benchmark's MLP (popdist_torch, 2
instances x 1 replica x 64, SGD, one fixed synthetic batch, one compute thread per process)
runs until told to stop. Within that launch, as ``benchmarks/progress_overhead.py`` does for
the progress records, the page is switched on and off in alternating windows (on, off, off,
on, ...): *on* is headless Chromium showing the page, which receives the figures from
``/events`` and redraws its table and chart once a second, the way a person watching the job
would; *off* is the same browser on ``about:blank``. Instance 0 logs its step count with a
timestamp every 20 steps; each window's rate is read from that log between the window's
ends. The job's own rate drifts by 10-30 % over tens of seconds on 2 shared cores, so the
windows are short and come in on-off-off-on order, which cancels a drift that is slow
against them. A round is 4 consecutive pairs; its ratio is its on windows' mean rate over
its off windows'; the figure is the median over rounds, and pairs go on (``--max-pairs``,
``--budget``) until it clears the goal by half the rounds' spread (issue 33). The CPU a
refresh costs is read from ``/proc``: poprun's own (it answers ``/events``) and the
browser's (it receives, parses and redraws), the on windows' less the off windows', per
refresh. Writes docs/status-page.{md,json}.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import training_throughput as tt
from benchmarks._common import round_ratios, rounds_until_clear

sys.path.insert(1, str(Path(__file__).resolve().parent))  # goals

#: The goal (issues 32, 53): a refresh a second costs the job ≤ 1 %, judged by the CPU it
#: takes (``goals.noise_floor``: a 2-core A/B cannot resolve 1 %); the A/B, stated beside
#: it, must stay ≥ 0.98, and its rounds go on until it clears that with margin.
GOAL = 0.98

LOG_EVERY = 20
TICK_S = os.sysconf("SC_CLK_TCK")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1000,900",
)  # fmt: skip


def worker(log: str, model_name: str) -> None:
    """One instance: train until ``log``.stop exists; instance 0 logs ``time steps`` lines."""
    import torch

    import popdist
    import popdist.poptorch
    import popdist_torch as poptorch

    torch.set_num_threads(1)
    popdist.init()
    opts = popdist.poptorch.Options()
    model = tt._model(model_name)
    wrapped = poptorch.trainingModel(model, opts, torch.optim.SGD(model.parameters(), lr=0.01))
    rank = opts.Distributed.processId
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(tt.MICRO, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (tt.MICRO,), generator=gen)
    stop = Path(log + ".stop")
    flag = torch.zeros(1)
    collectives = popdist.collectives.for_run()
    with open(log, "a") if rank == 0 else open(os.devnull, "w") as out:
        steps = 0
        while True:
            for _ in range(LOG_EVERY):
                wrapped(x, y)
            steps += LOG_EVERY
            out.write(f"{time.time()} {steps}\n")
            out.flush()
            flag.fill_(1.0 if stop.exists() else 0.0)
            collectives.allreduce_(flag, name="stop")  # every instance stops at the same step
            if flag.item() > 0:
                return


def _steps_at(log: Path, when: float) -> float:
    """Instance 0's step count at ``when`` (linear between logged points)."""
    points = [tuple(map(float, line.split())) for line in log.read_text().splitlines() if line]
    before = [p for p in points if p[0] <= when]
    after = [p for p in points if p[0] > when]
    if not before or not after:
        raise RuntimeError("the window lies outside the training log")
    (t0, s0), (t1, s1) = before[-1], after[0]
    return s0 + (s1 - s0) * (when - t0) / (t1 - t0)


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (those still alive)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / TICK_S
    return total


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (*FLAGS, f"--user-data-dir={tempfile.mkdtemp(prefix='status-page-')}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service("/usr/bin/chromedriver"))


def _launch(log: Path) -> tuple[subprocess.Popen[str], str]:
    from benchmarks._common import which

    argv = [
        which("poprun"), "--num-instances", "2", "--num-replicas", "2", "--status-port", "0",
        sys.executable, str(Path(__file__).resolve()), "--worker", str(log),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("poprun: the job's live page: "):
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, line.split()[-1]
    raise RuntimeError("poprun never printed the page's address")


def measure(
    pairs: int, window: float, warmup: float, per_round: int, max_pairs: int, budget_s: float
) -> dict[str, Any]:
    """Alternating windows with the page on and off, within one launch: ``pairs`` pairs, then
    more (up to ``max_pairs``, within ``budget_s``) until the goal clears with margin. A round is
    ``per_round`` consecutive pairs; its ratio is its on windows' mean rate over its off
    windows'. Short windows in on-off-off-on order cancel the job's drift; the rounds' spread
    is what the margin is judged against (issue 33)."""
    from goals import clears

    work = Path(tempfile.mkdtemp(prefix="status-page-bench-"))
    log = work / "steps.log"
    proc, url = _launch(log)
    driver = _browser()
    rates: dict[str, list[float]] = {"on": [], "off": []}
    cpu: dict[str, list[float]] = {"poprun_on": [], "poprun_off": [], "browser_on": [],
                                   "browser_off": []}  # fmt: skip
    state: list[bool | None] = [None]

    def rounds() -> list[float]:
        return round_ratios(rates["on"], rates["off"], per_round)

    def one_pair(pair: int) -> None:
        for on in (True, False) if pair % 2 == 0 else (False, True):
            if on != state[0]:
                driver.get(url if on else "about:blank")
                state[0] = on
                time.sleep(1.0)  # the page's first fetch and drawing are not a refresh
            browser_pids = _descendants(driver.service.process.pid)
            t0, p0, b0 = time.time(), _cpu_s([proc.pid]), _cpu_s(browser_pids)
            time.sleep(window)
            t1, p1, b1 = time.time(), _cpu_s([proc.pid]), _cpu_s(browser_pids)
            while log.stat().st_mtime <= t1:
                time.sleep(0.05)  # the log's next point, past the window's end
            rate = (_steps_at(log, t1) - _steps_at(log, t0)) / (t1 - t0)
            key = "on" if on else "off"
            rates[key].append(rate * 2 * tt.MICRO)  # samples/s of the 2 instances
            cpu[f"poprun_{key}"].append((p1 - p0) / (t1 - t0))
            cpu[f"browser_{key}"].append((b1 - b0) / (t1 - t0))

    try:
        while not log.exists() or not log.read_text():
            time.sleep(0.2)  # the instances start (torch imports); the log appears
        time.sleep(warmup)
        rounds_until_clear(
            one_pair, pairs,
            settled=lambda: len(rates["off"]) % per_round == 0
            and clears(rounds(), GOAL, "≥"),
            max_rounds=max_pairs, budget_s=budget_s,
        )  # fmt: skip
    finally:
        driver.quit()
        Path(str(log) + ".stop").touch()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    ratios = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
    per_refresh = {
        who: statistics.median(cpu[f"{who}_on"]) - statistics.median(cpu[f"{who}_off"])
        for who in ("poprun", "browser")
    }  # CPU seconds a second with the page on, less off: a refresh a second
    return {"rates": rates, "pair_ratios": ratios, "ratios": rounds(),
            "ratio": statistics.median(rounds()), "cpu": cpu, "cpu_per_refresh_s": per_refresh,
            "pairs_run": len(ratios), "per_round": per_round}  # fmt: skip


def serve_cost(requests: int = 300) -> float:
    """Seconds poprun's endpoint takes to answer one ``/status`` of a 2-instance job, measured
    in one process (client included, so an upper bound): the server-side part of a refresh."""
    import urllib.request
    from types import SimpleNamespace

    from poprun.run.status.server import StatusServer

    def figures() -> list[Any]:
        now = time.monotonic()
        return [
            SimpleNamespace(instance=i, host="localhost", steps=1000, samples=64000,
                            step_time_s=0.01, wait_s=2.0, collectives=3000, bytes_reduced=1 << 30,
                            rss_bytes=400 << 20, rss_peak_bytes=410 << 20, last_progress=now,
                            reported_at=now, pending=None)
            for i in range(2)
        ]  # fmt: skip

    server = StatusServer("127.0.0.1", 0)
    server.live.attach(figures, instances=2, started=time.monotonic() - 60)
    server.start()
    times = []
    try:
        for _ in range(requests):
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"{server.url}/status", timeout=10) as answer:
                answer.read()
            times.append(time.perf_counter() - t0)
    finally:
        server.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=24, help="on/off window pairs, at least")
    parser.add_argument("--per-round", type=int, default=4, help="window pairs a round")
    parser.add_argument("--max-pairs", type=int, default=48, help="more pairs until margin")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds for the pairs")
    parser.add_argument("--window", type=float, default=4.0, help="seconds a window")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the first")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, "mlp")
        return

    from benchmarks._common import Summary, machine, table, write_doc
    from poprun.run.status.server import page

    got = measure(args.pairs, args.window, args.warmup, args.per_round, args.max_pairs, args.budget)
    got["serve_s"] = serve_cost()
    size = len(page())
    on, off = Summary(tuple(got["rates"]["on"])), Summary(tuple(got["rates"]["off"]))
    ratios = Summary(tuple(got["ratios"]))
    out = {"pairs": got["pairs_run"], "window_s": args.window, "page_bytes": size, **got,
           "machine": machine()}  # fmt: skip
    from benchmarks._common import save_results

    cost = got["cpu_per_refresh_s"]
    # The page's extra CPU a second (one refresh), against the 2 cores the 2 instances keep busy.
    expected_cost = max(0.0, cost["browser"]) / 2 + got["serve_s"] / 2
    out["expected_cost"] = expected_cost
    save_results("status-page", out)
    doc = __doc__ or ""
    body = "\n\n".join(
        [
            doc.split("\n\n", 2)[2].strip(),
            f"{got['pairs_run']} pairs of {args.window:g} s windows in one launch, in rounds of "
            f"{args.per_round} pairs; on / off: the median over rounds of a round's mean rate on "
            f"over its mean rate off (the median of the {got['pairs_run']} ratios per pair: "
            f"{statistics.median(got['pair_ratios']):.3f}).",
            table(
                ["page", "samples/s (median)", "on / off"],
                [
                    [
                        "on",
                        f"{on.median:.0f} (IQR {on.iqr:.0f})",
                        f"{got['ratio']:.3f} (IQR {ratios.iqr:.3f}, n={len(ratios.samples)} "
                        "rounds)",
                    ],
                    ["off", f"{off.median:.0f} (IQR {off.iqr:.0f})", ""],
                ],
            ),
            f"The page: {size} bytes (one file, sent once). A refresh (once a second): poprun "
            f"answers `/status` in {got['serve_s'] * 1e3:.2f} ms (median of 300 requests in one "
            f"process, client included); with the page on, poprun used "
            f"{cost['poprun'] * 1e3:+.1f} ms and the browser {cost['browser'] * 1e3:+.1f} ms of "
            "CPU a second more than with it off (medians over the windows; poprun's figure is "
            "within the noise of the progress records it parses). Taken from the job's two "
            f"busy cores, that CPU alone would cost it {expected_cost:.2%} of its throughput.",
            f"Goal (issues 32, 53): the page's CPU at most 1 % of the job's cores (the share "
            f"above), with on / off ≥ {GOAL} beside it (`goals.noise_floor`).",
        ]
    )
    path = write_doc(
        "status-page.md", "The live status page: training throughput, page on and off", body
    )
    print(body)
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
