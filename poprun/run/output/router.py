"""Everything one job writes, routed: instance streams, their pids and records, mpirun's text.

The supervisor feeds it the demultiplexed output of mpirun's pipes; it owns each instance's
:class:`~poprun.run.output.instance_stream.InstanceStream` (console, ``--output-dir`` file, stderr tail), learns
each instance's pid from its first stderr line, collects the structured error records
instances write, puts their progress records on the progress board, hands on the exit status of each instance on another host (its wrapper's
last line) and recognises mpirun's own failure notes. At the end it gives the ending
policy's evidence its per-instance part (:meth:`JobOutput.results`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import BinaryIO

from poprun import log
from poprun.config.run_config import RunConfig
from poprun.plan.topology import Topology
from poprun.run.evidence import ErrorRecord, ExitRecord, MpirunMessages
from poprun.run.output.instance_stream import InstanceStream, open_output_file
from poprun.run.progress.board import ProgressBoard, parse_line
from poprun.run.verdict import InstanceResult

#: mpirun's words when it has lost the daemon of a host (crashed, or its link gone): it ends
#: the job, though not with a box :class:`MpirunMessages` takes for its abort.
DAEMON_LOST = (
    "ORTE has lost communication with a remote daemon",
    "An ORTE daemon has unexpectedly failed",
)


class JobOutput:
    """Route one job's output; remember what the verdict needs."""

    def __init__(
        self,
        config: RunConfig,
        topology: Topology,
        *,
        on_pid: Callable[[int, int], None],
        on_abort: Callable[[], None],
        on_exit: Callable[[int, ExitRecord], None] = lambda instance, record: None,
        append: bool = False,
        board: ProgressBoard | None = None,
        secret: str = "",
        on_progress: Callable[[bool], None] = lambda moved: None,
    ) -> None:
        self.config = config
        self.topology = topology
        self.pids: dict[int, int] = {}
        self.records: dict[int, tuple[float, ErrorRecord]] = {}
        self.messages = MpirunMessages()
        self.streams: dict[tuple[int, str], InstanceStream] = {}
        self._files: list[BinaryIO] = []
        self._on_pid = on_pid
        self._on_abort = on_abort
        self._on_exit = on_exit
        self._exited: set[int] = set()  # instances whose exit status came
        self._append = append  # a restart adds to the files of the attempt before
        self._aborting = False
        #: Told once when mpirun says it lost a daemon (:data:`DAEMON_LOST`).
        self.on_daemon_lost: Callable[[], None] | None = None
        #: The instances' progress records, with the job's secret (:mod:`popdist.progress`).
        self.board = board
        self._secret = secret
        self._on_progress = on_progress

    def open_files(self) -> None:
        """With ``--output-dir``: every instance gets its two files, even if it stays silent."""
        if self.config.output_dir is None:
            return
        os.makedirs(self.config.output_dir, mode=0o755, exist_ok=True)
        for plan in self.topology.instances:
            self.stream(plan.index, "stdout")
            self.stream(plan.index, "stderr")

    def stream(self, instance: int, kind: str) -> InstanceStream:
        """The stream of ``instance``'s ``kind`` ("stdout" or "stderr"), made on first use."""
        key = (instance, kind)
        stream = self.streams.get(key)
        if stream is None:
            only = self.config.only_output_from_instance
            shown = only is None or only == instance
            console = (
                (sys.stdout.buffer if kind == "stdout" else sys.stderr.buffer) if shown else None
            )
            file = None
            if self.config.output_dir is not None:
                file = open_output_file(self.config.output_dir, instance, kind, append=self._append)
                self._files.append(file)
            stderr = kind == "stderr"
            stream = InstanceStream(
                instance,
                kind,
                console,
                file,
                on_pid=self._pid if stderr else None,
                on_record=self._record if stderr else None,
                on_exit=self._exit if stderr else None,
                on_progress=self._progress if stderr and self.board is not None else None,
            )
            self.streams[key] = stream
        return stream

    def on_instance(self, instance: int, kind: str, data: bytes) -> None:
        """Bytes an instance wrote."""
        self.stream(instance, kind).feed(data)

    def on_untagged(self, data: bytes) -> None:
        """A line of mpirun's own text: show it unless it is one of its failure notes."""
        text = data.decode("utf-8", "replace")
        for line in self.messages.feed_line(text):
            sys.stderr.write(line + "\n")
        log.debug(f"mpirun: {text.rstrip()}")
        if self.on_daemon_lost is not None and any(words in text for words in DAEMON_LOST):
            self.on_daemon_lost()
            self.on_daemon_lost = None
        if self.messages.aborting and not self._aborting:
            self._aborting = True
            self._on_abort()

    def _pid(self, instance: int, pid: int) -> None:
        self.pids[instance] = pid
        log.debug(f"instance {instance} has pid {pid}")
        self._on_pid(instance, pid)

    def _record(self, instance: int, line: bytes) -> None:
        record = ErrorRecord.from_line(line)
        if record is not None and instance not in self.records:
            log.debug(f"instance {instance} raised {record.type}")
            self.records[instance] = (time.monotonic(), record)

    def _progress(self, instance: int, line: bytes) -> None:
        """A progress record: onto the board (one without the job's secret is dropped)."""
        fields = parse_line(line, self._secret)
        if fields is None or self.board is None:
            log.debug(f"instance {instance}: a progress line without this job's secret, dropped")
            return
        fields["instance"] = instance  # the stream it came on says who sent it
        self._on_progress(self.board.update(fields))

    def _exit(self, instance: int, line: bytes) -> None:
        record = ExitRecord.from_line(line)
        if record is not None and instance not in self._exited:
            self._exited.add(instance)
            log.debug(f"instance {instance} ended with status {record.returncode}")
            self._on_exit(instance, record)

    def close(self) -> None:
        """End of the job: flush every stream and the console, close the files."""
        for stream in self.streams.values():
            stream.close()
        for line in self.messages.finish():
            sys.stderr.write(line + "\n")
        sys.stdout.flush()
        sys.stderr.flush()
        for handle in self._files:
            handle.close()
        self._files.clear()

    def results(self) -> tuple[InstanceResult, ...]:
        """Each instance's pid, stderr tail, error record and when it raised."""
        out = []
        for plan in self.topology.instances:
            stream = self.streams.get((plan.index, "stderr"))
            at, record = self.records.get(plan.index, (None, None))
            if at is None and stream is not None:
                at = stream.traceback_at  # no record: its Python traceback, if any
            out.append(
                InstanceResult(
                    index=plan.index,
                    host=plan.host,
                    pid=self.pids.get(plan.index),
                    stderr_tail=tuple(stream.tail_text()) if stream is not None else (),
                    error=record,
                    raised_at=at,
                )
            )
        return tuple(out)
