"""``--status-port``'s page in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``, which scripts/setup.sh installs as root) driven by selenium.

While a 2-instance job runs, the page lists both instances and their steps rise; when the
job hangs (instance 0 holds, the other waits in the allreduce) the ``--hang-timeout`` verdict
appears on the page (``--on-hang report``: the job goes on, so the page can still be read);
the job then finishes and the page says poprun no longer answers. Skipped, with the reason,
where Chromium is missing; under ``CI=true`` as root it must run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.support.jobs import ROOT, start_poprun
from tests.support.tiers import require

pytestmark = [pytest.mark.launch, pytest.mark.slow]

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
PROGRAM = str(ROOT / "tests" / "bin" / "progress_train.py")
#: Generous: torch imports on a loaded machine; nothing here is timed.
PATIENCE_S = 90.0
#: Chromium as root in a container: no sandbox, nothing fetched from the network.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1000,900",
)  # fmt: skip
T = TypeVar("T")


def unavailable() -> str | None:
    """Why the browser test cannot run here (None: it can)."""
    if CHROMIUM is None or DRIVER is None:
        return "chromium and chromium-driver are not installed (scripts/setup.sh installs them as root)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the dev extras have it)"
    return None


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    must = os.environ.get("CI", "").lower() == "true" and os.geteuid() == 0
    require("browser", unavailable(), must)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(DRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def _until(read: Callable[[], T], ok: Callable[[T], bool], what: str) -> T:
    """Read the page again until ``ok`` (it refreshes itself once a second)."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        got = read()
        if ok(got):
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: the page showed {got!r}")
        time.sleep(0.25)  # the page changes by itself; poll it


def _steps(driver: Any) -> dict[str, int]:
    """instance → the step the page's table shows."""
    script = """
        const out = {};
        for (const row of document.querySelectorAll('#instances tbody tr'))
            out[row.dataset.instance] = Number(row.querySelector('td.steps').textContent);
        return out;"""
    got: dict[str, int] = driver.execute_script(script)
    return got


def _address(proc: subprocess.Popen[str]) -> str:
    """The page's address from poprun's stderr; both pipes are then drained on threads."""
    assert proc.stderr is not None and proc.stdout is not None
    for line in proc.stderr:
        if line.startswith("poprun: the job's live page: "):
            for stream in (proc.stdout, proc.stderr):
                threading.Thread(target=stream.read, daemon=True).start()
            return line.split()[-1]
    pytest.fail("poprun never printed the page's address")


def test_the_page_follows_a_job_to_its_hang_verdict(browser: Any, tmp_path: Path) -> None:
    hold = tmp_path / "go"
    proc = start_poprun(
        "--num-instances", "2", "--num-replicas", "2", "--status-port", "0",
        "--hang-timeout", "4", "--on-hang", "report",
        sys.executable, PROGRAM, "--steps", "24", "--hold-after", "20", "--hold-file", str(hold),
        "--slow-instance", "1", "--slow-s", "0.2",
    )  # fmt: skip
    try:
        url = _address(proc)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/")
        browser.get(url)
        assert browser.title == "poprun job"
        first = _until(lambda: _steps(browser), lambda s: len(s) == 2 and min(s.values()) > 0,
                       "both instances with a step")  # fmt: skip
        _until(lambda: _steps(browser), lambda s: min(s.values()) > max(first.values()),
               "the steps rising")  # fmt: skip
        assert "progress_train.py" in browser.find_element("id", "command").text
        assert "2 instances x 1 replicas" in browser.find_element("id", "topology").text
        verdict = _until(
            lambda: browser.execute_script(
                "const v = document.querySelector('.note.hang'); return v ? v.textContent : '';"
            ),
            lambda text: text != "",
            "the hang verdict",
        )
        assert "poprun: the job is hung" in verdict and "--hang-timeout=4" in verdict
        assert browser.find_element("id", "state").text == "verdict"
        assert (
            browser.execute_script("return document.querySelectorAll('#chart polyline').length")
            == 2
        )
        hold.touch()  # instance 0 goes on; the job ends
        assert proc.wait(timeout=PATIENCE_S) == 0
        _until(lambda: browser.find_element("id", "state").text, lambda s: s.startswith("ended"),
               "the page noticing the end")  # fmt: skip
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # The suite's guard checks, after the browser quit, that no process of the job survived.


def test_the_page_of_many_instances_shows_the_slowest_and_sums_up_the_rest(
    browser: Any, tmp_path: Path
) -> None:
    """Issue 53: 20 light instances (records, no compute): the table has the 8 with the most
    own work, the chart as many lines, and one line gives the other 12's spread."""
    loop = str(ROOT / "tests" / "bin" / "progress_loop.py")
    proc = start_poprun(
        "--num-instances", "20", "--num-replicas", "20", "--status-port", "0",
        sys.executable, loop, "-", "400", "0.05",
    )  # fmt: skip
    try:
        browser.get(_address(proc))
        _until(lambda: _steps(browser), lambda s: len(s) == 8 and min(s.values()) > 0,
               "the 8 instances with the most own work")  # fmt: skip
        line = _until(lambda: browser.find_element("id", "summary").text,
                      lambda text: "(12) on localhost" in text, "the others' spread")  # fmt: skip
        assert line.startswith("Shown: the 8 of 20 instances with the most own work.")
        lines = "return document.querySelectorAll('#chart polyline').length"
        _until(lambda: browser.execute_script(lines), lambda n: 0 < n <= 8, "8 lines at most")
        proc.send_signal(signal.SIGTERM)  # poprun ends the job (forwards it)
        assert proc.wait(timeout=PATIENCE_S) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
