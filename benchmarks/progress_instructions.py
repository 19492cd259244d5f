"""What tracing a step's collectives costs, in instructions (issue 33): a figure the load cannot move.

    .venv/bin/python benchmarks/progress_instructions.py [--steps 1000] [--baseline DIR]

On a machine shared with other jobs a wall-clock cost of a few microseconds a step cannot
be told from noise. Instructions can: each case runs once under valgrind's callgrind, and
the cost of tracing is the instructions of a run with ``--steps`` traced steps minus those of
the same run untraced, over ``--steps``. A step is what the executor does around its
gradients: ``progress.enter`` with its caller's frame, 12 ``allreduce_async_`` calls on
gradient-sized tensors and their waits on a backend that does nothing, issued 10 frames deep
inside library code (as the reducer's hook is under autograd), then ``progress.leave`` with
the step's samples. The gradients are one :class:`popdist.progress.Group`, waited for through
``progress.wait_group``, as the reducer does; a tree from before groups (an earlier commit,
``--baseline DIR``) records each allreduce through the backend's wrappers and counts the step
with ``progress.step``, as its executor did. Each run takes minutes: valgrind also runs
torch's import. Not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GRAD_SIZES = (784 * 1024 // 64, 1024, 1024 * 512 // 64, 512, 5120, 10) * 2

#: Library code the collectives are issued from (compiled under popdist_torch's directory, so
#: the call-site walk counts it as library code, as it counts the executor's frames).
LIBRARY_FRAMES = """
def lib_call(caller, backend, grads, progress, group):
    outer = progress.enter(caller)
    lib_deep(8, backend, grads, progress, group)
    if group is None:
        progress.step(64, 0.01)
        progress.leave(outer)
    else:
        progress.leave(outer, 64, 0.01)


def lib_step(backend, grads, progress, group):
    if group is None:  # before groups: every allreduce through the backend's wrappers
        handles = [backend.allreduce_async_(g, name="popdist_torch.grad.w") for g in grads]
        for handle in handles:
            backend.wait(handle)
        return
    issue = backend.plain_async
    handles = [issue(g, name="popdist_torch.grad.w") for g in grads]
    progress.wait_group(group, backend.plain_wait, handles)


def lib_deep(n, backend, grads, progress, group):
    if n == 0:
        return lib_step(backend, grads, progress, group)
    return lib_deep(n - 1, backend, grads, progress, group)
"""


def worker(mode: str, steps: int) -> None:
    """``steps`` steps, traced (``on``) or not, from a user loop below library frames."""
    import torch

    import popdist_torch
    from popdist import progress

    class Null:
        def allreduce_async_(
            self, tensor: object, *, average: bool = False, name: str | None = None
        ) -> object:
            return object()

        def wait(self, handle: object) -> None:
            return None

    grads = [torch.zeros(n) for n in GRAD_SIZES]
    backend: Any = Null()
    if mode == "on":
        progress.tracker = progress.Tracker()
        progress.instrument(backend)
    group = None
    if hasattr(progress, "Group"):  # as the reducer: the backend's own methods, one group
        group = progress.Group("allreduce", ["popdist_torch.grad.w"] * len(grads), grads)
        backend.plain_async = progress.untraced(backend, "allreduce_async_")
        backend.plain_wait = progress.untraced(backend, "wait")
    where = os.path.join(os.path.dirname(popdist_torch.__file__), "_bench_frames.py")
    frames: dict[str, Any] = {}
    exec(compile(LIBRARY_FRAMES, where, "exec"), frames)
    call = frames["lib_call"]
    for _ in range(steps):
        call(sys._getframe(), backend, grads, progress, group)
    if mode == "on":
        assert progress.tracker is not None
        assert progress.tracker.steps == steps, "the steps were not counted"
        site = progress.tracker.recent[-1][6]
        assert site[2] == "worker", f"the site is {site}, not the user's loop"


def instructions(mode: str, steps: int, path: str | None) -> int:
    """Instructions callgrind counts for one run of :func:`worker`."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    argv += [sys.executable, __file__, "--worker", mode, "--steps", str(steps)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind: {proc.stderr[-1000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--baseline", help="packages of an earlier commit, for a before row")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return 0
    if shutil.which("valgrind") is None:
        print("progress_instructions not run: valgrind is not installed")
        return 0
    versions = {"this tree": str(ROOT), **({"baseline": args.baseline} if args.baseline else {})}
    for label, path in versions.items():
        off = instructions("off", args.steps, path)
        on = instructions("on", args.steps, path)
        per_step = (on - off) / args.steps
        print(
            f"{label}: on {on} − off {off} instructions over {args.steps} steps = "
            f"{per_step:,.0f} a step of {len(GRAD_SIZES)} allreduces, their waits and the step",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
