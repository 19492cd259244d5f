"""A job's time limit is not a cliff: a save-now notice before it, a clean end, a requeue.

A Slurm job ends at its time limit: Slurm sends SIGTERM, then SIGKILL, to whatever still
runs, and the work since the last checkpoint is lost. poprun makes that end a planned one:

1. **The notice.** poprun tells the instances to save now, by sending
   :data:`NOTICE_SIGNAL` (SIGUSR1) to mpirun, which forwards it to every instance on every
   node (Open MPI forwards SIGUSR1 by default, to each instance's process group).
   ``popdist`` turns it into a flag the training loop checks (``popdist.should_stop()``,
   :mod:`popdist.deadline`); the instance wrappers start the program with SIGUSR1 ignored,
   so a program that never imports popdist is not killed by it. The notice comes when poprun
   receives SIGUSR1 itself (``sbatch --signal=B:USR1@N`` with ``exec poprun`` in the
   script, or ``scancel --signal=USR1 --batch``), or ``--time-limit-margin`` seconds
   before the deadline (the Slurm job's end, or ``--timeout``, whichever comes first). It is
   sent again every :data:`NOTICE_REPEAT_S` until the job ends: an instance still starting
   (the signal ignored until ``import popdist``) gets a later one.
2. **The end.** The instances save and exit; poprun exits
   :data:`~poprun.errors.EXIT_TIME_LIMIT` (75). Those still running
   :data:`END_RESERVE_S` before the Slurm job's end are ended by poprun (SIGTERM, then
   SIGKILL), so poprun finishes before Slurm's own SIGTERM reaches it.
3. **The requeue.** With ``--requeue-on-timeout``, poprun then runs ``scontrol requeue
   $SLURM_JOB_ID``: the job goes back in the queue, runs its script again
   (``SLURM_RESTART_COUNT`` counts the runs) and resumes from its last checkpoint.

:class:`TimeLimit` is the part of the ending policy (:mod:`poprun.run.ending`) that decides
when the notice and the end are due: pure, on the policy's clock, unit-tested with a fake
one. The end time is read once, at launch, and only when ``--time-limit-margin`` or
``--requeue-on-timeout`` asks for it (:func:`job_end_time`: ``SLURM_JOB_END_TIME`` where
Slurm sets it, else ``squeue -h -j $SLURM_JOB_ID -o %e``; Slurm 22.05 does not set the
variable). :func:`job_end_time` and :func:`requeue` are the two calls that act (they run
``squeue`` and ``scontrol`` through an injected runner); their parsing is pure.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from poprun.errors import PoprunError

#: The save-now notice, as the instances receive it.
NOTICE_SIGNAL = signal.SIGUSR1
#: How long before the Slurm job's end poprun ends instances that still run after the
#: notice: the grace periods to end them (up to 5.8 s across hosts) and the requeue must fit
#: before Slurm's own SIGTERM at the end.
END_RESERVE_S = 10.0
#: How often the notice is sent again while the job runs.
NOTICE_REPEAT_S = 5.0
#: Where newer Slurm releases put the job's end (Unix seconds).
END_TIME_VAR = "SLURM_JOB_END_TIME"
#: Set inside a Slurm job (``sbatch``, ``salloc``, ``srun``).
JOB_ID_VAR = "SLURM_JOB_ID"
#: What Slurm prints when a job has no end time.
_NO_END = frozenset({"UNKNOWN", "N/A", "NONE", "UNLIMITED", "INFINITE", "NOT_SET", "INVALID"})

#: ``(argv, env)`` → ``(exit code, stdout, stderr)``: how the Slurm commands are run.
Runner = Callable[[Sequence[str], Mapping[str, str]], tuple[int, str, str]]


class TimeLimit:
    """When the notice and the end at the time limit are due (pure; the policy holds one).

    ``margin`` is ``--time-limit-margin``: notice this long before the deadline (None: only
    on SIGUSR1); ``end_at`` is the Slurm job's end on the policy's clock (None: no Slurm end
    known); ``requeue`` is ``--requeue-on-timeout``. ``deadline``, passed to each question,
    is the policy's live ``--timeout`` deadline (it moves while poprun is stopped).
    """

    def __init__(
        self, margin: float | None = None, end_at: float | None = None, requeue: bool = False
    ) -> None:
        self.margin, self.end_at, self.requeue = margin, end_at, requeue
        #: Why the notice was sent ("" while it has not been).
        self.noticed = ""
        #: A notice that arrived before the job was launched: sent as soon as it runs.
        self.pending = ""
        self.repeat_at: float | None = None
        #: poprun ended the job :data:`END_RESERVE_S` before the Slurm job's end.
        self.at_limit = False

    def received(self, why: str, t: float, *, running: bool) -> str:
        """SIGUSR1 reached poprun: the notice now (its reason), or once the job runs ("")."""
        if self.noticed:
            return ""
        if not running:
            self.pending = self.pending or why
            return ""
        return self._notify(why, t)

    def due(self, t: float, deadline: float | None) -> tuple[str, str]:
        """While the job runs: (the notice's reason, the end's reason), each "" when not due."""
        notice = ""
        if not self.noticed:
            why = self._notice_reason(t, deadline)
            if why:
                notice = self._notify(why, t)
        elif self.repeat_at is not None and t >= self.repeat_at:
            self.repeat_at = t + NOTICE_REPEAT_S
            notice = f"sending the save-now notice again ({self.noticed})"
        stop = ""
        stop_at = self.stop_at()
        if stop_at is not None and t >= stop_at and not self.at_limit:
            self.at_limit = True
            stop = (
                f"the Slurm job ends in {max(0.0, stop_at + END_RESERVE_S - t):.0f} s and "
                "the job still runs: ending it"
            )
        return notice, stop

    def next_time(self, deadline: float | None) -> float | None:
        """The next moment :meth:`due` may have something to say (None: none)."""
        times = []
        if not self.noticed:
            notice_at = self._notice_at(deadline)
            if self.pending:
                times.append(-math.inf)
            elif notice_at is not None:
                times.append(notice_at)
        elif self.repeat_at is not None:
            times.append(self.repeat_at)
        stop_at = self.stop_at()
        if stop_at is not None and not self.at_limit:
            times.append(stop_at)
        return min(times, default=None)

    def stop_at(self) -> float | None:
        """When poprun ends a job that still runs: :data:`END_RESERVE_S` before Slurm would."""
        return None if self.end_at is None else self.end_at - END_RESERVE_S

    def _notice_at(self, deadline: float | None) -> float | None:
        ends = [end for end in (self.end_at, deadline) if end is not None]
        if self.margin is None or not ends:
            return None
        return min(ends) - self.margin

    def _notice_reason(self, t: float, deadline: float | None) -> str:
        if self.pending:
            return self.pending
        notice_at = self._notice_at(deadline)
        if notice_at is None or t < notice_at:
            return ""
        assert self.margin is not None
        slurm = self.end_at is not None and (deadline is None or self.end_at <= deadline)
        what = "the Slurm job" if slurm else "--timeout"
        left = notice_at + self.margin - t
        return f"--time-limit-margin={self.margin:g}: {what} ends in {max(0.0, left):.0f} s"

    def _notify(self, why: str, t: float) -> str:
        self.noticed = why
        self.pending = ""
        self.repeat_at = t + NOTICE_REPEAT_S
        return why


# --- the Slurm job's end time ----------------------------------------------------------------


def parse_end_time(source: str, text: str) -> float | None:
    """An end time as Unix seconds, None for Slurm's words for "no end".

    ``SLURM_JOB_END_TIME`` holds Unix seconds; ``squeue -o %e`` prints local time,
    ``2026-11-25T20:15:03``. Anything else is an error naming ``source``.
    """
    word = text.strip()
    if not word or word.upper() in _NO_END:
        return None
    if word.isdigit():
        seconds = int(word)
        return float(seconds) if seconds > 0 else None
    try:
        return time.mktime(time.strptime(word, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        raise PoprunError(
            source,
            word,
            "is not an end time poprun can read (Unix seconds, or YYYY-MM-DDTHH:MM:SS)",
            "unset SLURM_TIME_FORMAT, or leave out --time-limit-margin and --requeue-on-timeout",
        ) from None


def run_command(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, str, str]:
    """Run a Slurm command, its output captured; a missing command is exit code 127."""
    try:
        done = subprocess.run(
            list(argv), env=dict(env), capture_output=True, text=True, timeout=30, check=False
        )
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer in 30 s"
    return done.returncode, done.stdout, done.stderr


def job_end_time(environ: Mapping[str, str], run: Runner = run_command) -> float | None:
    """The Slurm job's end (Unix seconds); None outside a job or for a job without one."""
    job = environ.get(JOB_ID_VAR)
    if not job:
        return None
    given = environ.get(END_TIME_VAR, "").strip()
    if given:
        return parse_end_time(END_TIME_VAR, given)
    argv = ["squeue", "-h", "-j", job, "-o", "%e"]
    code, out, err = run(argv, {**environ, "SLURM_TIME_FORMAT": "standard"})
    if code != 0:
        raise PoprunError(
            "--time-limit-margin/--requeue-on-timeout",
            None,
            f"cannot read Slurm job {job}'s end time: {' '.join(argv)} failed "
            f"({(err.strip().splitlines() or [f'exit code {code}'])[-1]})",
            "check that squeue works on this node, or leave both options out",
        )
    lines = out.strip().splitlines()
    return parse_end_time("squeue -o %e", lines[0] if lines else "")


def plan(
    margin: float | None,
    requeue: bool,
    environ: Mapping[str, str],
    clock: Callable[[], float],
    run: Runner = run_command,
) -> TimeLimit:
    """The run's :class:`TimeLimit`: the Slurm end read (and put on ``clock``) when asked."""
    end_at = None
    if margin is not None or requeue:
        end = job_end_time(environ, run)
        if end is not None:
            end_at = clock() + (end - time.time())
    return TimeLimit(margin=margin, end_at=end_at, requeue=requeue)


def requeue(environ: Mapping[str, str], run: Runner = run_command) -> str:
    """``scontrol requeue $SLURM_JOB_ID``: "" when done, else the line that says why not."""
    job = environ.get(JOB_ID_VAR, "")
    code, _, err = run(["scontrol", "requeue", job], environ)
    if code == 0:
        return ""
    why = (err.strip().splitlines() or [f"exit code {code}"])[-1]
    return (
        f"poprun: could not requeue Slurm job {job} (scontrol requeue: {why}); "
        "submit it again to resume from its last checkpoint"
    )


def requeuing(environ: Mapping[str, str]) -> str:
    """The line poprun writes before it requeues the job (Slurm may end poprun at once)."""
    job = environ.get(JOB_ID_VAR, "")
    return (
        f"poprun: requeuing Slurm job {job} (scontrol requeue): it runs its script again "
        "and resumes from its last checkpoint"
    )
