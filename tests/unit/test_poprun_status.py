"""The status views (issue 27): the straggler table, the live summary, /metrics and /status,
from made-up figures."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace

import pytest

from poprun.run.status import metrics, stragglers
from poprun.run.status.figures import (
    own_work_s,
    samples_per_s,
    seconds,
    size,
    span_s,
    wait_share,
)

pytestmark = pytest.mark.unit

MIB = 1 << 20


@dataclass(frozen=True)
class Call:
    seq: int
    kind: str
    name: str
    nbytes: int = 0
    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    site: str = "train.py:10"
    started: float = 0.0


@dataclass(frozen=True)
class Fig:
    instance: int
    host: str = "localhost"
    steps: int = 100
    samples: int = 6400
    step_time_s: float = 0.1
    wait_s: float = 1.0
    collectives: int = 300
    bytes_reduced: int = 300 * MIB
    rss_bytes: int = 200 * MIB
    rss_peak_bytes: int = 250 * MIB
    last_progress: float = 10.0  # the launch at 0: a span of 10 s
    reported_at: float = 0.0  # its last record (later than last_progress when it ends blocked)
    pending: Call | None = None


def _job(slow_wait: float = 1.0, fast_wait: float = 5.0, n: int = 2) -> list[Fig]:
    """Instance 1 is slow: it waits ``slow_wait`` s of its 10 s; the others ``fast_wait`` s."""
    return [Fig(i, wait_s=slow_wait if i == 1 else fast_wait) for i in range(n)]


def test_derived_figures() -> None:
    f = Fig(0, steps=100, wait_s=4.0, samples=6400, last_progress=12.0)
    span = span_s(f, started=2.0)
    assert span == 10.0 and span_s(f, started=2.0, now=14.0) == 12.0
    assert wait_share(f, span) == pytest.approx(0.4)
    assert own_work_s(f, span) == pytest.approx(6.0)
    assert samples_per_s(f, span) == pytest.approx(640.0)
    assert wait_share(f, 0.0) is None and samples_per_s(Fig(0, samples=0), 10.0) is None
    assert wait_share(Fig(0, wait_s=50.0), 10.0) == 1.0  # capped


def test_human_units() -> None:
    assert [size(512), size(3 * 1024), size(312 * MIB), size(5 << 30)] == [
        "512 B",
        "3 KiB",
        "312 MiB",
        "5 GiB",
    ]
    assert [seconds(0.0004), seconds(0.0412), seconds(3.2), seconds(95)] == [
        "400 µs",
        "41.2 ms",
        "3.20 s",
        "95 s",
    ]


def test_the_slowest_instance_and_its_cost() -> None:
    found = stragglers.slowest(_job(), started=0.0)
    assert found is not None
    assert (found.instance, found.host) == (1, "localhost")
    assert found.own_s == pytest.approx(9.0) and found.others_own_s == pytest.approx(5.0)
    assert found.cost_s == pytest.approx(4.0)  # instance 0 waited 5 s, the straggler 1 s
    assert found.cost_per_step_s == pytest.approx(0.04)
    assert found.cost_share == pytest.approx(0.4)
    assert found.worth_naming


def test_the_straggler_is_found_whatever_the_step_times_say() -> None:
    """Its slow part lies between its steps (a data loader): its own steps are the shortest,
    the others' include their wait for it."""
    job = [Fig(0, step_time_s=0.09, wait_s=8.0), Fig(1, step_time_s=0.01, wait_s=0.5)]
    found = stragglers.slowest(job, started=0.0)
    assert found is not None and found.instance == 1 and found.worth_naming


def test_the_end_of_run_table_names_the_straggler() -> None:
    lines = stragglers.report(_job(), started=0.0).splitlines()
    assert lines[0] == (
        "poprun: progress of the 2 instances (step time: mean; waiting: in collectives, "
        "share of the run):"
    )
    assert lines[1].split() == [
        "poprun:", "instance", "host", "steps", "step", "time", "waiting", "peak", "RSS",
    ]  # fmt: skip
    assert lines[2].split() == [
        "poprun:", "0", "localhost", "100", "100", "ms", "50%", "(5.00", "s)", "250", "MiB",
    ]  # fmt: skip
    assert lines[3].split()[1:7] == ["1", "localhost", "100", "100", "ms", "10%"]
    assert lines[4] == (
        "poprun: instance 1 (localhost) held the others up: they waited 4.00 s in all for it "
        "in collectives (40% of their time, 40 ms a step)"
    )
    assert len(lines) == 5
    assert len({len(line) for line in lines[1:4]}) == 1  # aligned columns


@pytest.mark.parametrize(
    ("slow_wait", "fast_wait", "named"),
    [
        (1.0, 5.0, True),  # own work 9 vs 5 s, the other lost 40 % of its time
        (0.0, 1.0, True),  # 10 vs 9 s: 11 % more, 10 % lost
        (0.0, 0.8, False),  # 10 vs 9.2 s: 8.7 % more: within the noise of equal work
        (4.6, 5.0, False),  # 5.4 vs 5 s: 8 % more, 4 % lost
        (5.0, 5.0, False),  # equal
        (9.1, 9.5, False),  # 0.9 vs 0.5 s: 80 % more, but only 4 % of the other's time lost
    ],
)
def test_the_thresholds(slow_wait: float, fast_wait: float, named: bool) -> None:
    job = _job(slow_wait, fast_wait)
    found = stragglers.slowest(job, started=0.0)
    assert found is not None and found.instance == (1 if slow_wait < fast_wait else 0)
    assert found.worth_naming is named
    assert ("held the others up" in stragglers.report(job, started=0.0)) is named


def test_with_four_instances_the_cost_is_the_others_together() -> None:
    job = [Fig(0, wait_s=5.0), Fig(1, wait_s=1.0), Fig(2, wait_s=6.0), Fig(3, wait_s=4.0)]
    found = stragglers.slowest(job, started=0.0)
    assert found is not None and found.instance == 1
    assert found.cost_s == pytest.approx(4.0 + 5.0 + 3.0)
    assert found.cost_per_step_s == pytest.approx(0.04)
    assert found.cost_share == pytest.approx(12.0 / 30.0)
    assert found.others_own_s == pytest.approx(5.0)


def test_nothing_printed_for_one_instance_or_without_progress() -> None:
    assert stragglers.report([Fig(0)], started=0.0) == ""
    assert stragglers.report([], started=0.0) == ""
    silent = [Fig(i, steps=0, collectives=0, wait_s=0.0) for i in range(2)]
    assert stragglers.report(silent, started=0.0) == ""


def test_collectives_without_steps_give_a_table_without_step_times() -> None:
    job = [Fig(i, steps=0, collectives=4, wait_s=0.5) for i in range(2)]
    lines = stragglers.report(job, started=0.0).splitlines()
    assert len(lines) == 4  # title, header, two rows; equal: no straggler
    assert lines[2].split()[1:] == ["0", "localhost", "0", "-", "5%", "(500", "ms)", "250", "MiB"]


def test_the_live_summary() -> None:
    job = [
        Fig(0, wait_s=5.0, last_progress=8.0, pending=Call(301, "allreduce", "grads.0", started=7.5)),
        Fig(1, wait_s=1.0, last_progress=0.5),
    ]  # fmt: skip
    text = stragglers.summary(job, now=10.0, instances=2, started=0.0)
    lines = text.splitlines()
    assert lines[0] == "poprun: status after 10 s, 2 instances:"
    assert lines[1].split()[-2:] == ["last", "progress"]
    assert lines[2].split()[-3:] == ["2.00", "s", "ago"]
    assert lines[3].split()[-3:] == ["9.50", "s", "ago"]
    assert lines[4] == "poprun: instance 0 is in collective #301 allreduce 'grads.0' for 2.50 s"
    assert lines[5].startswith("poprun: instance 1 (localhost) held the others up")


def test_the_live_summary_before_any_progress() -> None:
    text = stragglers.summary([], now=5.0, instances=1, started=3.5)
    assert text == "poprun: status after 1.50 s, 1 instance: no progress reported yet"


def _samples(text: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.labels.get("instance", "")
            out[(sample.name, key)] = sample.value
    return out


def test_prometheus_text_has_a_series_per_instance() -> None:
    job = [
        Fig(0, wait_s=5.0, pending=Call(7, "allreduce", 'a "quoted" name', started=8.0)),
        Fig(1, host="node1", wait_s=1.0, steps=0, samples=0),
    ]
    body = metrics.text(job, 10.0, instances=2, started=0.0).decode()
    got = _samples(body)
    assert got[("poprun_job_instances", "")] == 2
    assert got[("poprun_job_running_seconds", "")] == 10.0
    assert got[("poprun_instance_steps_total", "0")] == 100
    assert got[("poprun_instance_steps_total", "1")] == 0
    assert got[("poprun_instance_samples_per_second", "0")] == pytest.approx(640.0)
    assert ("poprun_instance_samples_per_second", "1") not in got  # no sample yet
    assert ("poprun_instance_step_seconds", "1") not in got  # no step yet
    assert got[("poprun_instance_collectives_total", "1")] == 300
    assert got[("poprun_instance_reduced_bytes_total", "0")] == 300 * MIB
    assert got[("poprun_instance_collective_wait_seconds_total", "0")] == 5.0
    assert got[("poprun_instance_collective_wait_ratio", "0")] == 0.5
    assert got[("poprun_instance_resident_memory_bytes", "1")] == 200 * MIB
    assert got[("poprun_instance_last_progress_age_seconds", "0")] == 0.0
    assert got[("poprun_instance_pending_collective_seconds", "0")] == 2.0
    assert ("poprun_instance_pending_collective_seconds", "1") not in got
    assert 'host="node1"' in body
    assert 'name="a \\"quoted\\" name"' in body  # the library escapes label values
    from prometheus_client.parser import text_string_to_metric_families

    types = {family.name: family.type for family in text_string_to_metric_families(body)}
    assert types["poprun_instance_steps"] == "counter"
    assert types["poprun_instance_resident_memory_bytes"] == "gauge"


def test_status_json_has_the_same_figures() -> None:
    job = [Fig(0, pending=Call(7, "broadcast", "params", started=9.0)), Fig(1, wait_s=4.0)]
    data = json.loads(json.dumps(metrics.status_json(job, 10.0, instances=2, started=0.0)))
    assert data["instances"] == 2 and data["running_s"] == 10.0
    first, second = data["progress"]
    assert first["instance"] == 0 and first["pending"] == {
        "seq": 7,
        "kind": "broadcast",
        "name": "params",
        "for_s": 1.0,
    }
    assert second["wait_share"] == pytest.approx(0.4) and second["pending"] is None
    assert second["samples_per_s"] == pytest.approx(640.0)
    assert first["last_progress_age_s"] == 0.0
    assert set(first) >= {
        "steps", "samples", "collectives", "bytes_reduced", "wait_s", "rss_bytes",
        "rss_peak_bytes", "step_time_s",
    }  # fmt: skip


def test_a_relaunch_shows_the_new_attempt() -> None:
    from poprun.run.status.server import Live

    live = Live()
    assert live.read()[0] == () and live.read()[2] == 0
    live.attach(lambda: [Fig(0)], instances=1, started=0.0)
    assert [f.instance for f in live.read()[0]] == [0]
    live.attach(lambda: [Fig(0), replace(Fig(1), steps=3)], instances=2, started=5.0)
    figures, _, instances, started = live.read()
    assert instances == 2 and started == 5.0 and [f.steps for f in figures] == [100, 3]


def test_summary_signals_outside_and_inside_slurm() -> None:
    import signal

    from poprun.run.signals import summary_signals

    assert summary_signals({}) == (signal.SIGUSR1, signal.SIGUSR2)
    # Inside a Slurm job SIGUSR1 is the time-limit notice (sbatch --signal=B:USR1@N).
    assert summary_signals({"SLURM_JOB_ID": "42"}) == (signal.SIGUSR2,)


def test_a_summary_request_is_counted_never_an_interruption_and_handlers_go_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import signal

    from poprun.run.signals import SignalInbox

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    inbox = SignalInbox().install()
    try:
        assert inbox.interrupting  # before the launch: a SIGINT would interrupt, this does not
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR2)
        assert inbox.summaries == 2 and inbox.received == []
    finally:
        inbox.restore()
    assert {sig: signal.getsignal(sig) for sig in before} == before


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"status_port": "70000"},
            "--status-port=70000: is not a TCP port; fix: give --status-port 0 to 65535",
        ),
        ({"status_port": "-1"}, "--status-port=-1: must be at least 0"),
        ({"status_port": "web"}, "--status-port=web: is not a whole number"),
        (
            {"status_address": "0.0.0.0"},
            "--status-address=0.0.0.0: has nothing to serve without --status-port",
        ),
    ],
)
def test_bad_status_options_are_one_line(values: dict[str, str], message: str) -> None:
    from poprun.config.run_config import build
    from poprun.errors import PoprunError

    with pytest.raises(PoprunError) as error:
        build(values, ("true",), {"PATH": "/usr/bin:/bin"})
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_status_options_are_read() -> None:
    from poprun.config.run_config import build

    config = build({"status_port": "0", "status_address": "::1"}, ("true",), {"PATH": "/bin"})
    assert (config.status_port, config.status_address) == (0, "::1")
    assert build({}, ("true",), {"PATH": "/bin"}).status_port is None


def test_an_instance_that_ends_blocked_waits_no_longer_than_its_span() -> None:
    # Instance 0 waited 9.7 s for instance 1, still blocked at its last record (at 10.2 s)
    # though its last progress was at 0.5 s: the share of its time lost is at most all of it.
    blocked = Fig(0, wait_s=9.7, last_progress=0.5, reported_at=10.2)
    stalled = Fig(1, wait_s=0.0, last_progress=0.5, reported_at=10.2)
    found = stragglers.slowest([blocked, stalled], started=0.0)
    assert found is not None and found.instance == 1
    assert 0.9 < found.cost_share <= 1.0


def test_status_adds_the_job_the_straggler_and_the_verdicts() -> None:
    from poprun.run.status.server import Live

    live = Live()
    live.job = {"command": "python train.py", "timeout_s": 60.0}
    notes = [("note", "poprun: instance 1 has waited 6 s"), ("hang", "poprun: the job is hung")]
    live.attach(lambda: _job(), instances=2, started=0.0, notes=lambda: notes)
    figures, _, _, started = live.read()
    extras = live.extras(figures, 10.0, started)
    assert extras["job"] == {"command": "python train.py", "timeout_s": 60.0}
    assert extras["straggler"]["instance"] == 1
    assert extras["straggler"]["line"].startswith(
        "poprun: instance 1 (localhost) held the others up"
    )
    assert [n["kind"] for n in extras["notes"]] == ["note", "hang"]
    live.attach(lambda: _job(slow_wait=5.0), instances=2, started=0.0)  # a new attempt
    assert live.extras(live.read()[0], 10.0, 0.0) | {"job": {}} == {
        "job": {},
        "straggler": None,  # nobody held the others up
        "notes": [],
    }


def test_the_page_s_refreshes_reuse_one_connection() -> None:
    """HTTP/1.1 keep-alive: a fetch a second costs no connect, accept or thread each time."""
    import http.client

    from poprun.run.status.server import StatusServer

    server = StatusServer("127.0.0.1", 0).start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        answers = []
        for _ in range(3):
            connection.request("GET", "/status")
            answer = connection.getresponse()
            answers.append((answer.status, answer.version, answer.will_close))
            json.loads(answer.read())
            if _ == 0:
                first_socket = connection.sock
            assert connection.sock is first_socket  # the same connection, not a new one
        assert answers == [(200, 11, False)] * 3
        connection.close()
    finally:
        server.close()


def test_events_stream_the_status_once_a_second_until_the_server_closes() -> None:
    """``/events``: server-sent events on one connection, each ``/status``'s JSON; closing the
    server ends the stream (the browser's EventSource then reports poprun gone)."""
    import http.client

    from poprun.run.status.server import StatusServer

    server = StatusServer("127.0.0.1", 0).start()
    closed = False
    try:
        server.live.job = {"command": "python train.py"}
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        connection.request("GET", "/events")
        answer = connection.getresponse()
        assert answer.status == 200
        assert answer.headers["Content-Type"] == "text/event-stream"
        assert answer.readline() == b"retry: 1000\n" and answer.readline() == b"\n"
        started = time.monotonic()
        events = []
        for _ in range(2):
            line = answer.readline()
            assert line.startswith(b"data: ") and answer.readline() == b"\n"
            events.append(json.loads(line.removeprefix(b"data: ")))
        assert time.monotonic() - started >= 0.9  # one a second, not as fast as it can
        assert all(e["job"] == {"command": "python train.py"} and "progress" in e for e in events)
        server.close()
        closed = True
        while line := answer.readline():  # the stream ends: no event is left hanging
            assert line.startswith(b"data: ") or line == b"\n"
        connection.close()
    finally:
        if not closed:
            server.close()


def test_the_page_is_one_self_contained_file_served_with_a_strict_policy() -> None:
    import urllib.request

    from poprun.run.status.server import PAGE_POLICY, StatusServer, page

    html = page().decode()
    assert len(page()) < 16_000  # small: it is sent once per browser
    assert "src=" not in html and "href=" not in html and "@import" not in html  # nothing fetched
    assert 'new EventSource("events")' in html  # only this server's /events, relative to the page
    assert "fetch(" not in html
    assert "innerHTML" not in html and "textContent = n.text" in html  # text set as text
    server = StatusServer("127.0.0.1", 0).start()
    try:
        with urllib.request.urlopen(f"{server.url}/", timeout=10) as answer:
            assert answer.read() == page()
            assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
            assert answer.headers["Content-Security-Policy"] == PAGE_POLICY
        with urllib.request.urlopen(f"{server.url}/status", timeout=10) as answer:
            data = json.loads(answer.read())
        assert {"job", "straggler", "notes", "progress"} <= set(data)
    finally:
        server.close()
    assert "connect-src 'self'" in PAGE_POLICY and "default-src 'none'" in PAGE_POLICY
