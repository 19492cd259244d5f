"""``--status-port``: the job's live figures over HTTP, served from a daemon thread.

``GET /metrics`` answers Prometheus' text format (:mod:`poprun.run.status.metrics`),
``GET /status`` (or ``/status.json``; past :data:`poprun.summary.THRESHOLD` instances the
slowest few and the others' spread, ``?all=1`` for every one) the same figures as JSON, with
the job's description
(command, topology, ``--timeout``), the straggler when one is worth naming, and the hang
notes and verdicts so far; ``GET /events`` that JSON once a second as a stream of
server-sent events; ``GET /`` a page that shows them, following ``/events`` (``page.html``:
one self-contained file, no network, a Content-Security-Policy that lets it reach this
server only; it shows no program output). A stream, not a fetch a second: the browser of a
person watching the job then spends no request, response and promise chain on each refresh,
only one message on a connection it keeps (headless Chromium: 4 ms of CPU a second against
7.5 for a fetch a second, drawing nothing; the page in all, 7.7 ms against 14; issue 33).

The socket is bound before anything is launched, so a port in use is a usage error (one
line, exit 2, nothing launched); it listens on 127.0.0.1 unless ``--status-address`` says
otherwise (the figures name hosts and paths of the job: not for the network by default).

The server only reads: each request takes a snapshot of the progress board through the
:class:`Live` view the supervisor keeps up to date (a relaunch points it at the new
attempt's board). The thread is a daemon and :meth:`StatusServer.close` stops it and closes
the socket, so neither a normal end nor an exception leaves it behind; it also ends every
open stream within its next second.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from poprun.errors import PoprunError
from poprun.run.status.figures import Figures

#: Requests a connection may take before the server gives up on it (a stuck scraper must
#: not hold a thread forever); also how long a stream's write may block on a client that
#: reads nothing.
REQUEST_TIMEOUT_S = 10.0
#: How often ``/events`` sends the figures.
EVENT_EVERY_S = 1.0


#: The page's security policy: its own inline script and style, requests to this server only.
PAGE_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'"
)


def page() -> bytes:
    """The status page (``page.html`` beside this module, shipped in the wheel)."""
    from importlib.resources import files

    return files("poprun.run.status").joinpath("page.html").read_bytes()


class Live:
    """What the endpoint shows: the current attempt's board, its size and launch time, the
    job's description and the attempt's notes and verdicts."""

    def __init__(self) -> None:
        self._snapshot: Callable[[], Sequence[Figures]] | None = None
        self._notes: Callable[[], Sequence[tuple[str, str]]] = tuple
        self.instances = 0
        self.started: float | None = None
        #: The job as the page titles it: command, topology, time-outs (set once by poprun).
        self.job: dict[str, Any] = {}

    def attach(
        self,
        snapshot: Callable[[], Sequence[Figures]],
        *,
        instances: int,
        started: float,
        notes: Callable[[], Sequence[tuple[str, str]]] = tuple,
    ) -> None:
        """From now on, show this board (a new attempt's, after a relaunch)."""
        self._snapshot = snapshot
        self._notes = notes
        self.instances = instances
        self.started = started

    def extras(self, figures: Sequence[Figures], now: float, started: float) -> dict[str, Any]:
        """What ``/status`` adds to the figures: the job, the straggler, notes and verdicts."""
        from poprun.run.status.stragglers import slowest

        straggler = slowest(figures, started, now)
        named = None
        if straggler is not None and straggler.worth_naming:
            named = {
                "instance": straggler.instance,
                "host": straggler.host,
                "line": straggler.line(),
            }
        notes = [{"kind": kind, "text": text} for kind, text in list(self._notes())]
        return {"job": self.job, "straggler": named, "notes": notes}

    def status(self, *, every: bool = False) -> bytes:
        """``/status``'s JSON at this moment: the figures (summed up past many instances,
        unless ``every``) and :meth:`extras`."""
        from poprun.run.status import metrics

        figures, now, instances, started = self.read()
        data = metrics.status_json(figures, now, instances=instances, started=started, every=every)
        data |= self.extras(figures, now, started)
        return json.dumps(data).encode()

    def read(self) -> tuple[Sequence[Figures], float, int, float]:
        """(figures, now, instances, launch time) at this moment (poprun's monotonic clock)."""
        now = time.monotonic()
        figures: Sequence[Figures] = ()
        if self._snapshot is not None:
            for _ in range(3):  # the board changes under us: a dict resized mid-copy
                with contextlib.suppress(RuntimeError):
                    figures = list(self._snapshot())
                    break
        return figures, now, self.instances, now if self.started is None else self.started


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    # Keep-alive: a scraper's request a second reuses one connection (and one handler thread)
    # instead of a connect, an accept and a new thread each time. Every answer but a stream's
    # has its length.
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/events":
            self._stream()
        elif path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST

            from poprun.run.status import metrics

            figures, now, instances, started = self.server.live.read()
            body = metrics.text(figures, now, instances=instances, started=started)
            self._send(200, CONTENT_TYPE_LATEST, body)
        elif path in ("/status", "/status.json"):
            every = "all=1" in self.path.partition("?")[2].split("&")
            self._send(200, "application/json", self.server.live.status(every=every))
        elif path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", page(), policy=PAGE_POLICY)
        else:
            self._send(
                404,
                "text/plain; charset=utf-8",
                b"not found: try /, /metrics, /status or /events\n",
            )

    def _stream(self) -> None:
        """``/events``: ``/status``'s JSON as one server-sent event a second, until the client
        leaves or the server closes. The connection is the stream's: it ends with it."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        closing = self.server.closing
        try:
            # After a dropped connection the browser tries again in a second, not in its own 3.
            self.wfile.write(b"retry: 1000\n\n")
            while True:
                self.wfile.write(b"data: " + self.server.live.status() + b"\n\n")
                self.wfile.flush()
                if closing.wait(EVENT_EVERY_S):
                    return
        except OSError:  # the client went away, or read nothing for REQUEST_TIMEOUT_S
            return

    def _send(self, code: int, content_type: str, body: bytes, *, policy: str = "") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if policy:
            self.send_header("Content-Security-Policy", policy)
        self.end_headers()
        with contextlib.suppress(OSError):  # the client went away
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: poprun's stderr is the job's report, not an access log."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], live: Live) -> None:
        self.live = live
        self.closing = threading.Event()  # set by StatusServer.close: the streams end
        if ":" in address[0]:  # an IPv6 address (``::1``)
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)


class StatusServer:
    """The endpoint, bound at construction, serving from :meth:`start` to :meth:`close`."""

    def __init__(self, address: str, port: int) -> None:
        self.live = Live()
        try:
            self._server = _Server((address, port), self.live)
        except socket.gaierror as error:
            raise PoprunError(
                "--status-address",
                address,
                f"is not an address of this host ({error.strerror or error})",
                "give an address such as 127.0.0.1 or 0.0.0.0, or leave it out",
            ) from None
        except OSError as error:
            raise PoprunError(
                "--status-port",
                port,
                f"cannot listen on {address}:{port} ({error.strerror or error})",
                "choose another port, or 0 for a free one" if port else "check --status-address",
            ) from None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen, when asked for 0)."""
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def start(self) -> StatusServer:
        """Serve from a daemon thread."""
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="poprun-status",
            daemon=True,
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, end the streams and close the socket (idempotent)."""
        self._server.closing.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
