"""A light instance that reports progress: ``progress_loop.py GATE STEPS STEP_S``.

It imports popdist (under poprun that starts its progress reporter: a record a second on
stderr), waits at the start gate in ``GATE`` (``tests/support/gate.py``; ``-`` for none), then
runs ``STEPS`` steps of ``STEP_S`` seconds each (sleeping: no compute), each counted as the
executor counts a step, and ends 0. No collectives, no torch: the cost of many instances to
poprun, not to the instances.
"""

import os
import sys
import time

import popdist  # noqa: F401 - under poprun: the progress reporter
from popdist import progress


def main() -> None:
    gate, steps, step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    if gate != "-":
        with open(os.path.join(gate, "go"), "rb") as go:
            with open(os.path.join(gate, "started"), "wb") as started:
                started.write(b"x")
            go.read()  # end of file: every instance released at once
    frame = sys._getframe()
    for _ in range(steps):
        began = time.monotonic()
        outer = progress.enter(frame)
        time.sleep(step_s)
        progress.leave(outer, samples=1, seconds=time.monotonic() - began)


if __name__ == "__main__":
    main()
